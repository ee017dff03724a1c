"""The real-container microservice testbed (`samm testbed-microservices`, issue 18): the
application's services as containers on a local Docker engine (app.py, containers.py), Locust as
the load (load.py, locustfile.py), per-second measurement (measure.py) and the guarded control
loop (loop.py), put together by run.py. docs/microservice-testbed.md describes it.

Kept import-light: app.py runs inside the containers with the standard library only."""
