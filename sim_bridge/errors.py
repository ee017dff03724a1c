"""Errors raised by the simulator bridge."""


class BridgeError(RuntimeError):
    """Base class of the bridge's errors."""


class GatewayError(BridgeError):
    """The JVM could not be started, reached, or died."""


class SimulatorError(BridgeError):
    """The simulator rejected a request (invalid config, unknown key, bad ids or bytes)."""


class RolloutWorkerLost(BridgeError):
    """A remote rollout worker died during a call; it has been replaced and its envs start
    afresh, so the rollout being collected must be thrown away (`agents.ppo.train` does)."""
