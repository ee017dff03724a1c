"""Errors raised by the simulator bridge."""


class BridgeError(RuntimeError):
    """Base class of the bridge's errors."""


class GatewayError(BridgeError):
    """The JVM could not be started, reached, or died."""


class SimulatorError(BridgeError):
    """The simulator rejected a request (invalid config, unknown key, bad ids or bytes)."""
