"""PyPTO compiles on a Ray cluster (``--executor ray``, docs/workers.md "A compile farm").

Cold compiles are independent of each other, so a build spreads them over a cluster with an
existing engine, Ray: each job (a region's tile candidates, its checked compile, a batch of
baseline ops) is a call to a Ray actor, one actor a slot, each keeping a fork server of its own
on its node (a ``LocalExecutor`` with its own ``Workers``, as a pool thread has here). The job's
files travel with it (its inputs and onnxruntime's reference); its answer comes back with the
files it made (the checked compile's artifacts), and the driver goes on as if the job had run
here: it checks, caches and ships exactly what a local build would. The compile is a function
of the job alone (docs/determinism.md: working folders of one length, a heap of its own), so a
blob built on the farm is byte-identical to one built locally (``tests/test_ray_farm.py``).

Every node needs this package and its pinned dependencies installed (``pip install
pypto-offline[ray]``); the driver writes the kernel cache, the nodes keep only their g++ cache.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from pypto_offline.errors import UsageError
from pypto_offline.pypto_kernels.cache import KernelCache, user_cache_base
from pypto_offline.pypto_kernels.cache_trust import Trust
from pypto_offline.pypto_kernels.jobs import pool
from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor
from pypto_offline.pypto_kernels.jobs.processes import Cancelled, Workers
from pypto_offline.pypto_kernels.jobs.protocol import (DATA_FILES, Job, JobResult, crashed,
                                                       timed_out)
from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S
from pypto_offline.targets import TARGETS, Target

RAY_REQUIREMENT = "ray==2.60.0"
# What a node may take beyond the job's own time limit: starting its fork server (importing
# torch and PyPTO, building the pass-verify calculator on a node's first job) and the transfer.
STARTUP_S = DEFAULT_TIMEOUT_S


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray", fix=f"pip install 'pypto-offline[ray]' "
                                                         f"({RAY_REQUIREMENT})") from None
    return ray


class _Node:
    """On a Ray worker: runs jobs in a fork server of its own (one per cost-model config),
    in a staging folder of a node-local kernel cache (whose g++ cache the node's jobs share)."""

    def __init__(self):
        logging.getLogger("ray").setLevel(logging.ERROR)
        self.workers = Workers()
        self.executor = LocalExecutor(self.workers)
        self.cache = KernelCache(user_cache_base() / "farm", Trust())  # the node user's own

    def run(self, bundle: dict) -> dict:
        staged = self.cache.staging()
        try:
            folder = (staged / "job").absolute()
            folder.mkdir()
            for name, data in bundle["files"].items():
                (folder / name).write_bytes(data)
            # the node's g++ cache is its own: not the driver's cache's team group to trust
            job = Job.from_dict({**bundle["job"], "cache_group": None})
            target = replace(TARGETS[bundle["target"]], pypto_platform=bundle["pypto_platform"])
            answer = self.executor.run(folder, job, target, bundle["timeout"])
            return {"answer": answer.to_dict(), "folder": str(folder),
                    "files": _files_made(folder, answer)}
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def shutdown(self) -> None:
        self.workers.shutdown()


def _files_made(folder: Path, answer: JobResult) -> dict[str, bytes]:
    """The files the driver reads back: every candidate's kept artifacts."""
    made = {}
    for candidate in answer.candidates:
        if candidate.artifacts:
            for path in sorted(Path(candidate.artifacts).rglob("*")):
                if path.is_file():
                    made[str(path.relative_to(folder))] = path.read_bytes()
    return made


class RayExecutor:
    """The driver's side: one actor a slot, each pool thread of the build talking to its own
    (a fork server serves one job at a time, and so does an actor)."""

    def __init__(self, address: str | None):
        ray = _ray()
        _connect(ray, address)
        self._ray = ray
        self._node = ray.remote(num_cpus=1, max_restarts=0)(_Node)
        self._actors: dict[int, object] = {}
        self._lock = threading.Lock()

    @property
    def slots(self) -> int:
        """The cluster's CPUs: how many jobs it runs at once."""
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def run(self, folder: Path, job: Job, target: Target, timeout: float) -> JobResult:
        """The job on the farm: the same result as a local run, its files in ``folder``."""
        ray = self._ray
        actor = self._actor()
        bundle = {"job": job.to_dict(), "target": target.name, "timeout": timeout,
                  "pypto_platform": target.pypto_platform,
                  "files": {name: (folder / name).read_bytes() for name in DATA_FILES
                            if (folder / name).exists()}}
        reply = actor.run.remote(bundle)
        try:
            done = self._wait(reply, timeout + STARTUP_S)
        except Cancelled:
            self._drop(actor)
            raise
        except ray.exceptions.GetTimeoutError:
            self._drop(actor)
            return JobResult.failed(timed_out(timeout))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as error:
            self._drop(actor)
            return JobResult.failed(crashed(f"on the Ray farm: {type(error).__name__}"))
        for name, data in done["files"].items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        # the answer names the node's folder: here it is this one
        return JobResult.from_dict(done["answer"]).relocated(done["folder"], str(folder))

    def _wait(self, reply, limit: float):
        """The reply, waited for a second at a time: an interrupted build stops waiting at once
        and its actor is killed, with its fork server."""
        ray, deadline = self._ray, time.monotonic() + limit
        while True:
            if pool.cancelled():
                raise Cancelled
            ready, _ = ray.wait([reply], timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            if ready:
                return ray.get(reply)
            if time.monotonic() >= deadline:
                raise ray.exceptions.GetTimeoutError

    def _actor(self):
        key = threading.get_ident()
        with self._lock:
            if key not in self._actors:
                self._actors[key] = self._node.remote()
            return self._actors[key]

    def _drop(self, actor) -> None:
        with self._lock:
            self._actors = {k: a for k, a in self._actors.items() if a is not actor}
        self._ray.kill(actor)

    def close(self, graceful: bool = True) -> None:
        """Every actor gone, then disconnected. ``graceful``: each actor first stops its fork
        server; an interrupted build kills them at once (a busy actor would answer its shutdown
        only after its job: Ctrl-C took 28 s), its fork servers dying with it (PDEATHSIG)."""
        with self._lock:
            actors, self._actors = list(self._actors.values()), {}
        for actor in actors:
            if graceful:
                with contextlib.suppress(Exception):
                    self._ray.get(actor.shutdown.remote(), timeout=30)
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        self._ray.shutdown()  # disconnects, or stops the instance started here


@contextlib.contextmanager
def ray_executor(address: str | None) -> Iterator[RayExecutor]:
    """An executor running every job given to it on the Ray cluster at ``address`` (default
    ``RAY_ADDRESS``, else a Ray instance started here for the block)."""
    executor = RayExecutor(address)
    try:
        yield executor
    except BaseException:
        executor.close(graceful=False)
        raise
    executor.close()


# Ray's own wait for an address where no cluster answers, or where something else does (an HTTP
# server, Ray's dashboard), is a retry loop of many minutes (and, with its timeouts shortened, a
# process abort): the address is checked, then probed, first, all within one deadline
# (docs/workers.md, "A compile farm").
PROBE_TIMEOUT_S = 5
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7  # HTTP/2's frame types (RFC 9113)
END_STREAM = ACK = 1
END_HEADERS = 4
# An HTTP/2 client's first words (RFC 9113, 3.4): the preface, then an empty SETTINGS frame. A
# gRPC server, as Ray's GCS and its Client server are, answers with a SETTINGS frame of its own;
# an HTTP/1 server (Ray's dashboard) with a status line.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, SETTINGS, 0, 0, 0, 0, 0])
# Each service by the first call Ray makes of it: its gRPC path and the request's bytes (an
# empty GetClusterIdRequest; a ClusterInfoRequest of type PING, 6).
SERVICES = {"gcs": ("a Ray cluster's GCS", b"/ray.rpc.NodeInfoGcsService/GetClusterId", b""),
            "client": ("a Ray Client server", b"/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06")}
ADDRESS_FIX = ("give HOST:PORT of a running cluster (`ray start --head --port 6379` prints it), "
               "ray://HOST:PORT for Ray Client, or auto; or leave --ray-address and RAY_ADDRESS "
               "unset for a Ray instance started for this build")


def _connect(ray, given: str | None) -> None:
    """``ray.init`` on the checked address, within seconds or a UsageError naming it. Ray
    installs a SIGTERM handler of its own in the driver; the build's (SIGTERM ends it as Ctrl-C
    does, exit 143) is put back."""
    label = f"--ray-address {given!r}" if given else \
        f"RAY_ADDRESS={os.environ.get('RAY_ADDRESS')!r}"
    address = given or os.environ.get("RAY_ADDRESS") or None
    # what Ray will connect to: "auto" means $RAY_ADDRESS when set (Ray's own rule), else a
    # cluster Ray finds on this machine; "local" starts one, as no address does
    reached = os.environ.get("RAY_ADDRESS") or address if address == "auto" else address
    if reached not in (None, "auto", "local"):
        service = "client" if reached.startswith("ray://") else "gcs"
        _probe(*_host_and_port(reached, label), service, label)
    started_here = {} if address else {"include_dashboard": False}
    handlers = _signal_handlers()
    try:
        ray.init(address=address, namespace="pypto-offline", logging_level=logging.ERROR,
                 log_to_driver=False, **started_here)
    except (ConnectionError, ValueError, RuntimeError, ImportError) as error:
        raise UsageError(f"{label}: Ray cannot connect ({type(error).__name__}: "
                         f"{str(error)[:300]})", fix=ADDRESS_FIX) from None
    finally:
        _restore(handlers)


def _host_and_port(address: str, label: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``ray://HOST:PORT`` split, the port a real one."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{label} is not HOST:PORT, ray://HOST:PORT, auto or local",
                         fix=ADDRESS_FIX)
    return host.strip("[]"), int(port)


def _probe(host: str, port: int, service: str, label: str) -> None:
    """Within PROBE_TIMEOUT_S in all: something listens at the address, speaks HTTP/2 and
    answers the first call Ray makes of the ``service`` the address names (``SERVICES``); else
    a UsageError naming what answered. Every wait is a socket's, in this thread, with a time-out
    of what is left: a Ctrl-C ends it."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        connection = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError as error:
        raise UsageError(f"{label}: no Ray cluster answers at {where} "
                         f"({error.strerror or type(error).__name__}, within "
                         f"{PROBE_TIMEOUT_S} s)", fix=ADDRESS_FIX) from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        connection.close()  # Ray's TLS handshake is its own: only the connection is checked
        return
    with connection:
        first = _first_answer(connection, deadline)
        stranger = _not_http2(first, where)
        if stranger:
            raise UsageError(f"{label}: {stranger}, not {SERVICES[service][0]}",
                             fix=ADDRESS_FIX)
        _check_service(_Frames(connection, deadline, first), where, service, label)


def _receive(connection: socket.socket, deadline: float) -> bytes | None:
    """The server's next bytes: b"" once it has hung up, None when it says nothing by the
    deadline."""
    connection.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return connection.recv(65536)
    except TimeoutError:
        return None
    except OSError:  # reset
        return b""


def _first_answer(connection: socket.socket, deadline: float) -> bytes | None:
    """What the server says to an HTTP/2 preface: at least a frame header's 9 bytes, what it
    said before hanging up (b"" for nothing), or None when it said nothing by the deadline."""
    with contextlib.suppress(OSError):  # one that hung up at once is heard so below
        connection.sendall(HTTP2_PREFACE)
    answer = b""
    while len(answer) < 9:
        chunk = _receive(connection, deadline)
        if not chunk:
            return None if chunk is None and not answer else answer
        answer += chunk
    return answer


def _not_http2(answer: bytes | None, where: str) -> str | None:
    """What answered at ``where``, when it is not an HTTP/2 server (None when it is)."""
    if answer is None:
        return f"something at {where} took the connection but said nothing within " \
               f"{PROBE_TIMEOUT_S} s"
    if answer.startswith(b"HTTP/") or answer.lstrip()[:1] == b"<":
        # a status line; an HTTP/1.0 server may answer a version it lacks with a page alone
        status = answer.lstrip().split(b"\n", 1)[0].strip()[:60].decode("latin-1")
        return f"an HTTP server answered at {where} ({status!r})"
    if not answer:
        return f"something at {where} took the connection and closed it without a word"
    if len(answer) >= 9 and answer[3] == SETTINGS:
        return None
    return f"something at {where} answered {answer[:16]!r}, not HTTP/2"


class _Frames:
    """The HTTP/2 frames a server sends on the connection, each as (type, flags, stream,
    payload); None once it hangs up, or is silent past the deadline (``late``)."""

    def __init__(self, connection: socket.socket, deadline: float, received: bytes):
        self.connection, self.deadline, self.buffer = connection, deadline, received
        self.late = False

    def next(self) -> tuple[int, int, int, bytes] | None:
        while len(self.buffer) < 9 or \
                len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
            chunk = _receive(self.connection, self.deadline)
            if not chunk:
                self.late = chunk is None
                return None
            self.buffer += chunk
        end = 9 + int.from_bytes(self.buffer[:3], "big")
        frame, self.buffer = self.buffer[:end], self.buffer[end:]
        return frame[3], frame[4], int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF, frame[9:]

    def send(self, data: bytes) -> bool:
        try:
            self.connection.sendall(data)
            return True
        except OSError:
            return False


def _check_service(frames: _Frames, where: str, service: str, label: str) -> None:
    """An HTTP/2 server answers at ``where``: it must answer the ``service``'s call. One that
    answers the other's (a Client server's port without ray://, a GCS's with it) is named,
    and the fix says how to give it."""
    name, path, _ = SERVICES[service]
    served = _served(frames, 1, service, where)
    if served:
        return
    other = "gcs" if service == "client" else "client"
    if served is not None and _served(frames, 3, other, where):
        given = f"ray://{where}" if other == "client" else where
        raise UsageError(f"{label}: {SERVICES[other][0]} answered at {where}, not {name}",
                         fix=f"give {given}")
    late = "" if served is not None else f" within {PROBE_TIMEOUT_S} s"
    raise UsageError(f"{label}: an HTTP/2 server answered at {where}, not {name} (no answer "
                     f"to {path.decode()}{late})", fix=ADDRESS_FIX)


def _served(frames: _Frames, stream: int, service: str, where: str) -> bool | None:
    """Whether the server answers the service's call (``SERVICES``) on ``stream`` with a
    message: an error has none (UNIMPLEMENTED, from a server without the service). None when
    it has not answered by the deadline."""
    _, path, request = SERVICES[service]
    headers = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
               (b":authority", where.encode()), (b"content-type", b"application/grpc"),
               (b"te", b"trailers"))
    # each header a literal without indexing, of a new name (RFC 7541, 6.2.2)
    block = b"".join(b"\0" + _hpack_string(name) + _hpack_string(value)
                     for name, value in headers)
    message = b"\0" + len(request).to_bytes(4, "big") + request  # not compressed
    if not frames.send(_frame(HEADERS, END_HEADERS, stream, block)
                       + _frame(DATA, END_STREAM, stream, message)):
        return False
    while (frame := frames.next()) is not None:
        kind, flags, on, payload = frame
        if kind == SETTINGS and not flags & ACK:
            frames.send(_frame(SETTINGS, ACK, 0))
        elif kind == GOAWAY:
            return False
        elif on == stream:
            if kind == DATA and len(payload) >= 5:  # a message: the call was answered
                return True
            if kind == RST_STREAM or flags & END_STREAM:
                return False
    return None if frames.late else False


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") \
        + payload


def _hpack_string(data: bytes) -> bytes:
    """A string as HPACK writes one not Huffman-coded: its length, an integer of a 7-bit prefix
    (RFC 7541, 5.1 and 5.2), then its bytes."""
    if len(data) < 127:
        return bytes([len(data)]) + data
    length, rest = bytearray([127]), len(data) - 127
    while rest >= 128:
        length.append(rest % 128 + 128)
        rest //= 128
    return bytes(length) + bytes([rest]) + data


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set them, and Ray sets none from another
    return {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}


def _restore(handlers: dict) -> None:
    for number, handler in handlers.items():
        if handler is not None:
            signal.signal(number, handler)
