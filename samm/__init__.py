"""SAMM: a MAPE-K monitoring and management daemon that scales cloud resources with learned
policies."""
__version__ = "0.1.0"
