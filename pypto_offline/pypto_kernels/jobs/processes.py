"""The PyPTO processes of a build: fork servers and the job children they fork, started,
adopted and killed as one (docs/workers.md).

A fork server (``python -m pypto_offline.pypto_kernels.worker --serve FOLDER``) imports torch and
pypto once, then forks a child per job. Every process leads a session of its own, dies with the
build (PDEATHSIG), and runs with fixed addresses and a pinned environment so that a compile is a
function of its job alone (docs/determinism.md).
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

from pypto_offline.errors import WorkerCannotStart
from pypto_offline.pypto_kernels import no_host_address
from pypto_offline.pypto_kernels.cache import new_staging, user_cache_base
from pypto_offline.pypto_kernels.jobs.protocol import (PR_SET_PDEATHSIG, SERVER_READY,
                                                       calculator_library, workspace)
from pypto_offline.pypto_kernels.platform import Platform
from pypto_offline.pypto_kernels.versions import PYPTO_VERSION

WORKER_MODULE = "pypto_offline.pypto_kernels.worker"
REAP_S = 10  # a killed child's group is gone at once; the server reports it within this
# PyPTO 0.2.0 orders some of its sets by object address (AssignMemoryType inserts a COPY_OUT/
# COPY_IN pair for each consumer in a std::set<Operation *>), so the op numbers and symbol names
# of its program.json and AICore sources follow where malloc puts its objects. With ASLR off,
# they are a function of the kernel once a compile allocates from a heap of its own
# (worker._in_fresh_thread, ``worker_environment``) and the strings it makes have the same
# lengths: the paths of its server's folder and of its own working folder
# (``protocol.workspace``), and its run folder's name, which PyPTO ends with the process id
# (worker.run_folder_name) and the host's address, which the workers hide (no_host_address.py).
# docs/determinism.md, "The heap a compile starts from".

NO_TCACHE = "glibc.malloc.tcache_count=0"


def worker_environment() -> dict[str, str]:
    """PyPTO's frontend walks hash-ordered containers: its program.json (op seeds, symbol names)
    depends on the hash seed. A fixed seed makes every build of a kernel the same bytes.

    And malloc's per-thread cache (tcache) off. A compile allocates from an arena apart from the
    main heap (worker._in_fresh_thread; ``WORKSPACE_CHARS`` says why that matters), but a chunk
    of the main heap that the compile frees would go into its thread's cache and serve its next
    allocation of that size, at an address the server's import left. Measured on tf_swin's
    region_16: one more environment variable of the build, or a 3-digit pid, changed its op
    numbers; not with the cache off, which costs ~3% CPU.

    And one OpenMP thread: the threads a worker's libraries start leave malloc arenas that a
    forked job's compile thread takes over, so their number moved tf_swin's region_16 op
    numbers too (``OMP_NUM_THREADS=1``, as a Ray worker has it, against the default of one per
    core: two blobs; docs/determinism.md, "The host's address"). Pinned, a build does not
    depend on the machine's core count or the caller's setting."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":")
                if t and not t.startswith(NO_TCACHE.split("=")[0] + "=")]
    return {**os.environ, "PYTHONHASHSEED": "0", "GLIBC_TUNABLES": ":".join(tunables + [NO_TCACHE]),
            "OMP_NUM_THREADS": "1"}


ADDR_NO_RANDOMIZE = 0x0040000  # <sys/personality.h>


def _fixed_addresses(libc) -> None:
    """In the worker, before exec: no address-space randomisation. PyPTO orders some of its
    internal maps by object address, so its program differs from run to run unless every run
    lays out memory the same way (as `setarch -R` does)."""
    current = libc.personality(0xFFFFFFFF)
    if current != -1:
        libc.personality(current | ADDR_NO_RANDOMIZE)


def _worker_preexec(build_pid: int, libc) -> None:
    """In a fork server, before exec (it already leads a session of its own): fixed addresses,
    and SIGKILL when the build dies. PDEATHSIG fires when the *thread* that forked the server
    ends: a pool thread starts its own servers and lives until the end of ``pool.each``,
    which then kills them. ``libc`` is loaded in the build: no dlopen between fork and exec."""
    _fixed_addresses(libc)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != build_pid:  # the build died before the line above: nobody to serve
        os._exit(1)


class Cancelled(BaseException):
    """In a pool thread: the build was interrupted, this region's work stops (no Kernel record,
    nothing cached; ``compile_region`` removes its staging folder on the way out)."""


class Workers:
    """The PyPTO processes of one build: its fork servers (one per pool thread and cost-model
    config) and the job children they fork. Started, adopted and killed under one lock, so that
    an interrupt either finds a process (and kills its process group) or keeps it from
    starting."""

    def __init__(self):
        self._lock = threading.Lock()
        self._groups: set[int] = set()  # process groups (= their leader's pid) to kill on cancel
        self._servers: dict[tuple, Server] = {}
        self.cancelled = False

    def start(self, command: list[str], **options) -> subprocess.Popen:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        with self._lock:
            if self.cancelled:
                raise Cancelled
            # A session (and process group) of its own: killing the group takes PyPTO's
            # children too (host g++, cmake), and a terminal's Ctrl-C reaches the build only.
            process = subprocess.Popen(command, start_new_session=True,
                                       preexec_fn=partial(_worker_preexec, os.getpid(), libc),
                                       **options)
            self._groups.add(process.pid)
        return process

    def adopt(self, group: int) -> None:
        """A job child that leads its own session: killed with the others on cancel (at once
        when the build is cancelled already)."""
        with self._lock:
            if self.cancelled:
                kill_group(group)
                raise Cancelled
            self._groups.add(group)

    def finished(self, group: int) -> None:
        with self._lock:
            self._groups.discard(group)

    def cancel(self) -> None:
        """No process starts from now on; the running ones die with their process groups."""
        with self._lock:
            self.cancelled = True
            for group in self._groups:
                kill_group(group)

    def server(self, staging_root: Path, platform: Platform) -> Server:
        """This thread's fork server for ``platform`` (PyPTO reads it at import), started on
        first use. One per thread: a server runs one job at a time, and the thread that forks
        it stays alive as long as it (PDEATHSIG)."""
        key = (threading.get_ident(), platform.digest)
        with self._lock:
            server = self._servers.get(key)
        if server is None:
            server = Server(self, staging_root, platform)  # starting takes the lock
            with self._lock:
                self._servers[key] = server
        return server

    def servers(self) -> list[Server]:
        """The fork servers running for this build."""
        with self._lock:
            return list(self._servers.values())

    def drop(self, server: Server) -> None:
        """Kill a server (and its folder) that cannot serve on: the next job starts another."""
        with self._lock:
            self._servers = {k: v for k, v in self._servers.items() if v is not server}
        server.close(self)

    def shutdown(self) -> None:
        """At the end of the build's regions (or on its way out): every server dies."""
        with self._lock:
            servers = list(self._servers.values())
        for server in servers:
            self.drop(server)


def kill_group(group: int) -> None:
    """SIGKILL a process group (its leader's pid: it leads a session of its own). The number
    is not reused while the leader is unreaped or any process of its group lives; at worst (a
    leader reaped but not yet unregistered, its group empty) the kill finds nobody."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:  # already gone, and all of its group with it
        pass


class Replies:
    """The lines a fork server writes on its stdout, read with a deadline (``select``: a pool
    thread must notice a time-out, and the server's death as end of file)."""

    def __init__(self, stream):
        self._fd = stream.fileno()
        self._buffer = b""

    def next(self, deadline: float) -> str | None:
        """The next line; "" once the server is gone, None at the deadline."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


class ServerGone(Exception):
    """The fork server died, or stopped answering within the job's time (``timed_out``)."""

    def __init__(self, timed_out: bool = False):
        super().__init__()
        self.timed_out = timed_out


class Server:
    """A fork server (``worker.serve``): imports torch and pypto once, under one platform
    (``platform.py``), then forks one child per job. Its folder, in the build's staging area,
    holds the PyPTO config it imported with, the platform's overlay, its import-time side files
    and its log (docs/workers.md)."""

    def __init__(self, workers: Workers, staging_root: Path, platform: Platform):
        self.staging = new_staging(staging_root, "server")
        # PyPTO reads its config and log folder's paths at import: of one length (``workspace``)
        self.folder = workspace(self.staging, "server")
        self.folder.mkdir(parents=True)
        (self.folder / "server.json").write_text(json.dumps(
            {"platform": platform.server_settings(),
             "calculator_cache": str(calculator_cache())}))
        with open(self.folder / "server.log", "wb") as log:
            self.process = workers.start(
                [sys.executable, "-m", WORKER_MODULE, "--serve", str(self.folder)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=self.folder,
                env=no_host_address.preloaded(worker_environment(),
                                              no_host_address.build(self.folder)))
        self._replies = Replies(self.process.stdout)
        self.ready = False

    def wait_ready(self, limit: float, workers: Workers) -> bool:
        """Until the server has imported torch and pypto; False when it ran out of time. A
        server that dies first never compiled: its environment is broken, for every region
        (unless the build killed it)."""
        reply = self._replies.next(time.monotonic() + limit)
        if reply is None:
            return False
        if reply != SERVER_READY:
            self.process.wait()
            if workers.cancelled:
                raise Cancelled
            raise WorkerCannotStart(
                f"a PyPTO worker process could not start (exit code {self.process.returncode}): "
                f"{last_line(self.folder / 'server.log')}",
                fix=f"check that '{sys.executable} -m {WORKER_MODULE}' can import torch and "
                    f"pypto {PYPTO_VERSION}")
        self.ready = True
        return True

    def run(self, job_path: Path, timeout: float, workers: Workers) -> int | None:
        """Run one job in a forked child: its exit code (negative: the signal that killed it),
        or None when it ran out of time (its whole process group is killed then)."""
        try:
            self.process.stdin.write(f"{job_path}\n".encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise ServerGone from None
        child, deadline = None, time.monotonic() + timeout
        try:
            reply = self._replies.next(deadline)
            if reply and " " not in reply:  # "<pid>": the child leads its own session now
                child = int(reply)
                workers.adopt(child)
                reply = self._replies.next(deadline)
            if reply is None:  # out of time: the child's group dies, and the server, which
                if child is not None:  # reaps it, serves the next job
                    kill_group(child)
                    if self._replies.next(time.monotonic() + REAP_S):
                        return None
                raise ServerGone(timed_out=True)
            if not reply:
                raise ServerGone
            return int(reply.split()[1])
        except BaseException:
            if child is not None:
                kill_group(child)
            raise
        finally:
            if child is not None:
                workers.finished(child)

    def close(self, workers: Workers) -> None:
        kill_group(self.process.pid)
        self.process.wait()
        workers.finished(self.process.pid)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.staging, ignore_errors=True)


def last_line(log: Path) -> str:
    """The last non-blank line of a worker's log: for an import failure, the exception itself."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    meaningful = [line for line in lines if line]
    return meaningful[-1][:300] if meaningful else "it printed nothing"


def calculator_cache() -> Path:
    return user_cache_base() / "calculator"


def calculator_built() -> bool:
    """Whether this machine's fork servers find PyPTO's calculator built; if not, the first one
    builds it (``protocol.calculator_library``). Asked of torch's installed version, as the
    build does not import torch."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return True  # no server starts without torch: nothing will be built (the build says why)
    return calculator_library(calculator_cache(), torch_version).exists()
