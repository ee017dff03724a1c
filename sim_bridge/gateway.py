"""Starts, health-checks and stops the Java gateway (one JVM hosting many simulations).

The JVM binds a free loopback port that it picks itself (`--port 0`) and reports on stdout.
It exits on its own when our stdin pipe closes, which happens however this process ends, `kill
-9` included, so no JVM outlives its Python parent.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from py4j.java_gateway import GatewayParameters, JavaGateway
from py4j.protocol import Py4JError, Py4JJavaError

from .errors import GatewayError, SimulatorError

READY_PREFIX = "SAMM_GATEWAY_PORT="
LOOPBACK = "127.0.0.1"
AUTH_TOKEN_ENV = "SAMM_GATEWAY_AUTH_TOKEN"  # the Py4J token's variable, read by Main.java
#: how long one batched step may take before the step channel gives up on the JVM
STEP_TIMEOUT_S = 60.0


def find_jar() -> Path:
    """`$SAMM_GATEWAY_JAR`, else the Maven build in this checkout (`java/target/`)."""
    env = os.environ.get("SAMM_GATEWAY_JAR")
    if env:
        # an operator who names a jar means that jar: running the checkout's build instead hides a typo
        if not Path(env).is_file():
            raise GatewayError(f"SAMM_GATEWAY_JAR names {env}, which is not a file")
        return Path(env)
    built = Path(__file__).resolve().parent.parent / "java" / "target" / "samm-gateway.jar"
    if built.is_file():
        return built
    raise GatewayError(
        f"the Java gateway jar was not found (looked at: {built}); build it with `make setup` or "
        "`cd java && mvn package`, or set SAMM_GATEWAY_JAR")


def find_java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise GatewayError("no `java` executable found (install OpenJDK 17: `make setup` does)")
    return java


@contextlib.contextmanager
def _first_sigint_deferred():
    """A Ctrl-C during a Py4J call waits for its answer (a second one does not wait). Py4J's own
    handling of one inside a call logs a traceback and then fails on itself (AttributeError:
    'GatewayConnection' object has no attribute 'shutdown_socket'), leaving the connection cut:
    the verbs' "interrupted" line came after a traceback, or never, exit 1. Only the main thread
    receives signals; elsewhere, or under a SIGINT handler other than Python's own, the call runs
    as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pending = []

    def hold(signum, frame):
        if pending:   # the second: the user insists
            raise KeyboardInterrupt
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


class Gateway:
    """One JVM process and the Py4J connection to it."""

    def __init__(self, jar: str | Path | None = None, heap: str = "1g", start_timeout_s: float = 60.0,
                 quiet: bool = True, call_timeout_s: float = 600.0):
        self.jar = Path(jar) if jar else find_jar()
        cmd = [find_java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true", "-jar", str(self.jar),
               "--address", LOOPBACK, "--port", "0", "--parent-pid", str(os.getpid())]
        if quiet:
            cmd.append("--quiet")
        self._stderr_tail: deque[str] = deque(maxlen=50)
        self._owner_pid = os.getpid()
        # Py4J runs whatever a client asks and any local user can reach a loopback port: the JVM
        # answers only the holder of this token, passed in its environment (a command line is public)
        auth_token = secrets.token_hex(16)
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**os.environ, AUTH_TOKEN_ENV: auth_token},
                # undecodable bytes must not kill the reader threads: an undrained stderr pipe blocks the JVM
                encoding="utf-8", errors="replace", bufsize=1,
                # out of the terminal's process group: a Ctrl-C meant for Python killed the JVM too, and
                # closing the environments then logged py4j tracebacks before the clean stop (the JVM
                # still exits with us: stdin EOF and --parent-pid)
                start_new_session=True,
            )
        except OSError as exc:  # e.g. a `java` that is not executable
            raise GatewayError(f"cannot start the Java gateway with {cmd[0]} ({exc})") from None
        self._closed = False
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        try:
            self.port = self._await_port(start_timeout_s)
        except BaseException:
            # a Ctrl-C during a slow start: the JVM leads a session of its own (no SIGINT reaches it)
            # and our reader threads keep its pipes open, so it lived on until this interpreter exited
            self._kill()
            raise
        self._channel: StepChannel | None = None
        self._channel_lock = threading.Lock()
        self.call_timeout_s = call_timeout_s
        try:
            self._py4j = JavaGateway(
                # a JVM that stops answering (SIGSTOP, a debugger) fails the call after call_timeout_s
                # instead of hanging it for ever
                gateway_parameters=GatewayParameters(address=LOOPBACK, port=self.port, auto_convert=False,
                                                     auto_field=False, eager_load=True,
                                                     read_timeout=call_timeout_s, auth_token=auth_token),
            )
            self.entry = self._py4j.entry_point
            self.version = self.call("ping")
        except BaseException:
            self._kill()  # a JVM we cannot talk to must not live on until this interpreter exits
            raise
        atexit.register(self.close)

    # -- lifecycle ---------------------------------------------------------------------------
    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self._stderr_tail.append(line.rstrip())

    def _await_port(self, timeout_s: float) -> int:
        result: list[str] = []
        ended: list[bool] = []
        answered = threading.Event()  # the port line came, or stdout ended

        def read() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if not result and line.startswith(READY_PREFIX):
                    result.append(line[len(READY_PREFIX):].strip())
                    answered.set()
                # and on to EOF: a JVM told to log to stdout (JAVA_TOOL_OPTIONS=-Xlog:gc) hung for good,
                # every step timing out, once nobody read the pipe and it filled
            ended.append(True)
            answered.set()

        reader = self._stdout_reader = threading.Thread(target=read, daemon=True)
        reader.start()
        answered.wait(timeout_s)
        if not result:
            timed_out = not ended  # else stdout ended: the JVM exited (or closed it) early
            self._kill()
            self._stderr_reader.join(timeout=2)  # its last words, for the message
            what = (f"did not report its port within {timeout_s:.0f} s" if timed_out
                    else f"exited with code {self.proc.returncode} before reporting its port")
            raise GatewayError(f"the Java gateway ({self.jar}) {what}" + self._stderr_hint())
        return int(result[0])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self._closed and self.proc.poll() is None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:
            # a forked child: the JVM and the sockets are its parent's. Closing them here shut the
            # parent's Py4J connections down, and closing the pipes hung for ever on a lock that a
            # reader thread (not forked along) held at the fork
            return
        if self._channel is not None:
            self._channel.close()
        try:
            self._py4j.close()
        except Exception:  # noqa: BLE001 - closing a dead connection is fine
            pass
        self._kill()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass

    def _kill(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # the JVM exits on EOF
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        """Our ends of the JVM's stdout and stderr: else each gateway keeps two descriptors until the
        garbage collector finds them (and warns about them at some random later moment)."""
        pipes = []
        # a pipe is closed only once its reader thread is done (it reads to EOF once the JVM is gone)
        for reader, pipe in ((getattr(self, "_stdout_reader", None), self.proc.stdout),
                             (self._stderr_reader, self.proc.stderr)):
            if reader is not None:
                reader.join(timeout=2)
            if reader is None or not reader.is_alive():
                pipes.append(pipe)
        for pipe in pipes:
            try:
                if pipe is not None:
                    pipe.close()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------------
    def call(self, method: str, *args):
        """Call an entry-point method; Java exceptions become `SimulatorError`."""
        if not self.alive():
            raise GatewayError(self.not_running_message())
        started = time.monotonic()
        try:
            with _first_sigint_deferred():
                return getattr(self.entry, method)(*args)
        except Py4JJavaError as exc:
            message = _java_message(exc)
            self._release(exc.java_exception)
            raise SimulatorError(message) from None
        except Py4JError as exc:
            if time.monotonic() - started >= self.call_timeout_s and self.alive():
                # Py4J drops the timeout from its error: name it, or the message says nothing
                raise GatewayError(f"the JVM (pid {self.pid}) did not answer {method} within "
                                   f"{self.call_timeout_s:g} s (stopped or hung?)") from exc
            raise GatewayError(f"Py4J call {method} failed: {exc}" + self._failure_hint()) from exc

    def _release(self, java_object) -> None:
        """Frees a JVM object now. Left to Py4J, a Java exception (held in a reference cycle once a
        method of it was called) is freed only by a later cyclic GC, maybe after this gateway closed:
        its finalizer then dials the dead JVM's port and logs an ERROR traceback at a random moment."""
        try:
            self._py4j.detach(java_object)
        except Exception:  # noqa: BLE001 - the JVM frees it anyway when it exits
            pass

    def step_channel(self) -> "StepChannel":
        """The raw-socket hot path for batched steps (opened on first use; one per gateway)."""
        with self._channel_lock:
            if not self.alive():
                raise GatewayError(self.not_running_message())
            if self._channel is None or self._channel.broken:
                # a broken connection is replaced: the JVM serves any number of them
                port, token = str(self.call("openStepChannel")).split(":")
                try:
                    # at most the control calls' timeout: a stopped JVM hung every step for 60 s
                    # whatever it was (60 s stays the steps' default, as before)
                    self._channel = StepChannel(int(port), token, timeout_s=min(STEP_TIMEOUT_S, self.call_timeout_s),
                                                explain_failure=self._failure_hint)
                except OSError as exc:
                    raise GatewayError(f"cannot connect to the gateway's step channel ({exc})"
                                       + self._failure_hint()) from exc
            return self._channel

    def not_running_message(self) -> str:
        return "the Java gateway is not running" + self._failure_hint()

    def _failure_hint(self) -> str:
        """Why calls fail, as far as we know: the JVM's exit code and its last stderr lines."""
        try:
            code = self.proc.wait(timeout=0.5)  # a JVM killed mid-call closes its sockets before it is reaped
        except subprocess.TimeoutExpired:
            code = None
        died = code is not None and not self._closed
        return (f" (the JVM, pid {self.pid}, exited with code {code})" if died else "") + self._stderr_hint()

    def _stderr_hint(self) -> str:
        return ("; JVM stderr: " + " | ".join(list(self._stderr_tail)[-5:])) if self._stderr_tail else ""


class StepChannel:
    """Client of the gateway's step channel (see StepChannel.java): per call one frame out
    (`>iii` op, batch id and length, then the payload) and one frame back (`>ii` status and
    length, then the packed snapshots or an error message). No Py4J parsing, escaping or Base64
    on the paths that run once per environment step: steps, and the resets of autoreset."""

    OP_STEP = 1
    OP_RESET = 2
    MAX_FRAME = 1 << 24  # StepChannel.java drops the connection on a longer request

    def __init__(self, port: int, token: str, timeout_s: float = STEP_TIMEOUT_S, explain_failure=lambda: ""):
        """`explain_failure()`: what the owner knows when the connection fails (e.g. the JVM's
        exit code), appended to the error."""
        self.timeout_s = timeout_s
        self.sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(token.encode("ascii"))
        self._buf = bytearray(1 << 16)
        self._lock = threading.Lock()
        self._explain_failure = explain_failure
        self.broken = False  # after a call that failed half-way: never used again

    def _recv(self, view: memoryview) -> int:
        n = self.sock.recv_into(view)
        if n == 0:
            raise GatewayError("the step channel closed (did the JVM exit?)" + self._explain_failure())
        return n

    def _read_into(self, view: memoryview) -> None:
        while len(view):
            view = view[self._recv(view):]

    def step(self, batch_id: int, actions: bytes) -> bytes:
        """One batched step: int8 actions in, the packed snapshots of every env out."""
        return self._call(self.OP_STEP, batch_id, actions)

    def reset(self, batch_id: int, request: bytes) -> bytes:
        """A reset request (docs/bridge-protocol.md) in, the packed snapshots of those envs out."""
        return self._call(self.OP_RESET, batch_id, request)

    def _call(self, op: int, batch_id: int, payload: bytes) -> bytes:
        if len(payload) > self.MAX_FRAME:
            raise SimulatorError(f"a step-channel request of {len(payload)} bytes is over its limit of "
                                 f"{self.MAX_FRAME} bytes (too many envs in one call)")
        with self._lock:
            if self.broken:
                raise GatewayError("the step channel was closed after an earlier call failed; "
                                   "get a new one from Gateway.step_channel()")
            try:
                status, reply = self._exchange(op, batch_id, payload)
            except BaseException as exc:
                # The reply of this call may still arrive: read by the next call, it would be taken
                # for that call's answer. So the connection is dropped, whatever went wrong.
                self.broken = True
                self.close()
                if isinstance(exc, socket.timeout):
                    raise GatewayError(f"no reply on the step channel within {self.timeout_s:g} s; "
                                       "the connection was closed" + self._explain_failure()) from exc
                if isinstance(exc, OSError):
                    raise GatewayError(f"the step channel to the Java gateway failed ({type(exc).__name__}: {exc})"
                                       + self._explain_failure()) from exc
                raise
        if status != 0:
            raise SimulatorError(reply.decode("utf-8", errors="replace"))
        return reply

    def _exchange(self, op: int, batch_id: int, payload: bytes) -> tuple[int, bytes]:
        self.sock.sendall(struct.pack(">iii", op, batch_id, len(payload)) + payload)
        # The JVM writes a reply in one write: one recv usually brings all of it, header included.
        buf = memoryview(self._buf)
        got = 0
        while got < 8:
            got += self._recv(buf[got:])
        status, length = struct.unpack_from(">ii", self._buf)
        if 8 + length > len(self._buf):
            grown = bytearray(8 + length)
            grown[:got] = self._buf[:got]
            self._buf = grown
            buf = memoryview(self._buf)
        if got < 8 + length:
            self._read_into(buf[got:8 + length])
        return status, bytes(buf[8:8 + length])

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _java_message(exc: Py4JJavaError) -> str:
    try:
        return str(exc.java_exception.getMessage()) or str(exc.java_exception.toString())
    except Exception:  # noqa: BLE001
        return str(exc)


_shared: Gateway | None = None
_shared_lock = threading.Lock()


def shared_gateway() -> Gateway:
    """The process-wide gateway, started on first use and stopped at interpreter exit."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.alive():
            if _shared is not None:
                _shared.close()  # a JVM that died: else its pipes stay open until the interpreter exits
            _shared = Gateway()
        return _shared


def close_shared_gateway() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None
