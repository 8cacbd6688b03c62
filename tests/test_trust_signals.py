"""PyPTO worker processes belong to their build (docs/workers.md): SIGINT and SIGTERM end the build
and all its workers at once, a killed build takes its workers (and their children) with it, a time
limit kills the worker's whole process group, and a worker that cannot start fails the build
instead of turning every region into a fallback.

The builds here are cold builds of a tiny model, interrupted long before any compile finishes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest

import pypto_offline
from pypto_offline.pypto_kernels.cache import STAGING

from tests.onnx_builders import GraphBuilder
from tests.terminal import sigint_as_from_a_terminal

REPO = Path(__file__).resolve().parents[1]
WORKER = "pypto_offline.pypto_kernels.worker"
STARTUP_S = 180   # a cold build reaches its first worker in seconds; the machine may be busy
# The hanging kernel's time limit. It runs from the job's hand-over to a started fork server
# (processes.Server.run), and the forked child reaches the kernel's hang at once (its own
# child's pid written 0.05 s after the hand-over, three runs); a child that did not is a
# failure of its own (``child_runs_on``). 45 s before: the test waited 40 s out for nothing.
TIME_LIMIT_S = 5


def tiny_model(folder: Path) -> Path:
    b = GraphBuilder()
    path = folder / "tiny.onnx"
    onnx.save(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])), path)
    return path


def environment(*first_on_path: Path) -> dict[str, str]:
    """This checkout's code for the build and its workers, after ``first_on_path``."""
    path = [*map(str, first_on_path), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}


def start_build(tmp_path: Path, env=None) -> subprocess.Popen:
    """A cold build of the tiny model, run in ``tmp_path`` with a relative --cache-dir (which
    the workers, running in their job folders, must still find)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pypto_offline", tiny_model(tmp_path), "--target", "kirin9050",
         "--no-tile-search", "-o", tmp_path / "tiny.ptom", "--cache-dir", "cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or environment(),
        cwd=tmp_path, preexec_fn=sigint_as_from_a_terminal)


def live_processes() -> dict[int, tuple[str, int]]:
    """pid → (command line, session id) of every process that is not a zombie."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after the name
            state, session = stat[0], stat[3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state != "Z":
            found[int(entry.name)] = (cmdline, int(session))
    return found


def processes_of(tmp_path: Path, sessions: set[int]) -> dict[int, str]:
    """The workers of this test's build (their job is under ``tmp_path``), and any process in the
    session of one of them (the worker's own children)."""
    return {pid: cmd for pid, (cmd, session) in live_processes().items()
            if (WORKER in cmd and str(tmp_path) in cmd) or session in sessions}


def wait_for_a_worker(build: subprocess.Popen, tmp_path: Path) -> set[int]:
    """Once a worker of the build runs: the sessions its workers lead (none when they share the
    build's session, as before workers had sessions of their own)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        workers = processes_of(tmp_path, set())
        if workers:
            return {pid for pid in workers if live_processes().get(pid, ("", 0))[1] == pid}
        if build.poll() is not None:
            pytest.fail(f"the build ended (exit {build.returncode}) before any worker started: "
                        f"{build.communicate()[1]}")
        time.sleep(0.05)
    build.kill()
    pytest.fail(f"no worker started within {STARTUP_S} s")


def wait_until_compiling(build: subprocess.Popen, tmp_path: Path) -> None:
    """Until a worker has imported torch and pypto (its start marker) and is compiling."""
    deadline = time.monotonic() + STARTUP_S
    while not list((tmp_path / "cache" / STAGING).glob("*/*/worker.started")):
        if build.poll() is not None or time.monotonic() > deadline:
            build.kill()
            pytest.fail(f"no worker got to compile: {build.communicate()[1]}")
        time.sleep(0.05)


def remaining_after(seconds: float, tmp_path: Path, sessions: set[int]) -> dict[int, str]:
    """Processes of the build still alive after ``seconds`` (SIGKILLed ones take a moment)."""
    deadline = time.monotonic() + seconds
    while (left := processes_of(tmp_path, sessions)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # leave nothing running behind a failing test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.mark.pypto
@pytest.mark.parametrize("signum,code,when", [
    (signal.SIGINT, 130, "while the worker starts"),
    (signal.SIGTERM, 143, "while the worker compiles"),
])
def test_a_signal_ends_the_build_and_every_worker_within_5_s(signum, code, when, tmp_path):
    build = start_build(tmp_path)
    sessions = wait_for_a_worker(build, tmp_path)
    if when == "while the worker compiles":
        wait_until_compiling(build, tmp_path)
    build.send_signal(signum)
    try:
        _, err = build.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        build.kill()
        remaining_after(0, tmp_path, sessions)
        pytest.fail(f"the build still ran 5 s after {signum.name}")
    assert build.returncode == code, err
    # after the progress lines, one line and no traceback
    assert err.strip().splitlines()[-1] == "pypto-offline: interrupted", err
    assert "Traceback" not in err and err.count("pypto-offline:") == 1, err
    assert not remaining_after(1, tmp_path, sessions)
    assert not (tmp_path / "tiny.ptom").exists() and not (tmp_path / "tiny.report.html").exists()
    assert not list((tmp_path / "cache" / STAGING).glob("*")), "a staging folder is left behind"


def finished_build(folder: Path) -> bytes:
    """The tiny model built to the end in ``folder`` (its cache there): the blob's bytes."""
    build = start_build(folder)
    _, err = build.communicate(timeout=STARTUP_S * 2)
    assert build.returncode == 0, err
    return (folder / "tiny.ptom").read_bytes()


@pytest.mark.pypto
def test_a_build_interrupted_mid_compile_then_rebuilt_on_its_cache_ships_the_clean_blob(
        tmp_path):
    """Ctrl-C while PyPTO compiles, then the same build again on the same cache: the blob is the
    one a build on a clean cache ships (on main the interrupted compile was cached as a crashed
    kernel, and every later build shipped the region unfused with exit 0)."""
    interrupted, clean = tmp_path / "interrupted", tmp_path / "clean"
    interrupted.mkdir(), clean.mkdir()
    build = start_build(interrupted)
    wait_for_a_worker(build, interrupted)
    wait_until_compiling(build, interrupted)
    build.send_signal(signal.SIGINT)
    assert build.wait(timeout=5) == 130
    assert finished_build(interrupted) == finished_build(clean)
    assert pypto_offline.load(clean / "tiny.ptom").message.kernels[0].compiled


def hanging_kernel_build(tmp_path: Path, timeout: float) -> str:
    """A build (as a script) whose kernel source starts a child process that writes its pid to
    ``child.pid`` and sleeps, then hangs: what PyPTO's g++ or cmake would be, mid-compile. It
    prints the kernel's fallback reason and whether the executor's result was transient."""
    return textwrap.dedent(f"""
        import sys
        from pypto_offline.pypto_kernels import codegen, compiler
        from pypto_offline.targets import TARGETS
        from tests.executors import RecordingExecutor
        from tests.fusion_helpers import fuse
        import onnx

        SABOTAGE = '''
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import os, sys, time; "
                          "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
                          "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(300)",
                          {str(tmp_path / 'child.pid')!r}])
        time.sleep(300)
        '''
        honest = codegen.kernel_source
        compiler.kernel_source = lambda *args: honest(*args) + SABOTAGE
        executor = RecordingExecutor()
        graph, plan = fuse(onnx.load({str(tiny_model(tmp_path))!r}))
        (kernel,) = compiler.compile_kernels(graph, plan, TARGETS["kirin9050"],
                                             cache_dir={str(tmp_path / 'cache')!r}, search=False,
                                             timeout={timeout}, executor=executor)
        print(kernel.fallback_reason)
        print("transient:", executor.runs[0][2].transient)
        """)


def wait_for_child(build: subprocess.Popen, tmp_path: Path) -> int:
    deadline = time.monotonic() + STARTUP_S
    while not (tmp_path / "child.pid").exists():
        if build.poll() is not None or time.monotonic() > deadline:
            build.kill()
            pytest.fail(f"the worker never started its child: {build.communicate()}")
        time.sleep(0.05)
    return int((tmp_path / "child.pid").read_text())


def child_runs_on(tmp_path: Path, seconds: float) -> bool:
    """Whether the hanging kernel's child still runs after ``seconds`` (then it is killed)."""
    pid_file = tmp_path / "child.pid"
    assert pid_file.exists(), "the worker never reached the kernel: no child was started"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + seconds
    while child in live_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = child in live_processes()
    if alive:
        os.kill(child, signal.SIGKILL)
    return alive


@pytest.mark.pypto
def test_a_killed_build_takes_its_workers_and_their_children_with_it(tmp_path):
    build = subprocess.Popen([sys.executable, "-c", hanging_kernel_build(tmp_path, 600)],
                             cwd=REPO, env=environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_for_a_worker(build, tmp_path)
    child = wait_for_child(build, tmp_path)
    sessions = wait_for_a_worker(build, tmp_path)  # now with the job's: a job leads its own
    assert child in processes_of(tmp_path, sessions) or not sessions  # in the worker's session
    build.kill()
    build.wait()
    left = remaining_after(5, tmp_path, sessions)
    assert not child_runs_on(tmp_path, 0) and not left, f"orphans of the killed build: {left}"


@pytest.mark.pypto
def test_a_timed_out_worker_dies_with_its_children_and_the_failure_is_transient(tmp_path):
    """The time limit kills the worker's whole process group, and the fallback is marked as not
    the kernel's fault (the cache does not keep it as the kernel's verdict)."""
    build = subprocess.run([sys.executable, "-c", hanging_kernel_build(tmp_path, TIME_LIMIT_S)],
                           cwd=REPO, env=environment(),
                           capture_output=True, text=True, timeout=STARTUP_S + 120)
    assert build.returncode == 0, build.stderr
    assert not child_runs_on(tmp_path, 2), "the timed-out worker's child runs on"
    reason, first = build.stdout.strip().splitlines()[-2:]
    assert f"PyPTO compile did not finish within {TIME_LIMIT_S} s" in reason
    assert first == "transient: True", first


@pytest.mark.pypto
def test_a_worker_that_cannot_start_fails_the_build_with_its_cause(tmp_path):
    """A torch that fails to import (any broken environment): exit 2 naming the cause, not a
    build that 'passes' with every region fallen back."""
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text(
        "raise ImportError('torch is broken here on purpose')\n")
    build = start_build(tmp_path, env=environment(broken))
    _, err = build.communicate(timeout=STARTUP_S + 120)
    assert build.returncode == 2, err
    line = err.strip().splitlines()[-1]  # after the progress lines, one error line
    assert "could not start" in line and "torch is broken here on purpose" in line, err
    assert "Traceback" not in err, err
    assert not (tmp_path / "tiny.ptom").exists()
    assert not list((tmp_path / "cache" / STAGING).iterdir()), "a staging folder is left"


class OurHandlerRan(Exception):
    pass


def test_cli_main_in_process_turns_sigterm_into_exit_143_and_restores_the_handler(
        monkeypatch, capfd):
    from pypto_offline import cli

    def terminated(_argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives first
        return 0

    def ours(*_):
        raise OurHandlerRan

    previous = signal.signal(signal.SIGTERM, ours)  # a test process must not die of SIGTERM
    try:
        monkeypatch.setattr(cli, "run", terminated)
        assert cli.main(["whatever.onnx"]) == 143
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capfd.readouterr().err == "pypto-offline: interrupted\n"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_whose_raise_a_finaliser_swallowed_still_ends_the_wait():
    """Python runs a signal handler wherever the main thread next runs Python code, a
    finaliser included, and a finaliser's exception is only printed: the build's handler
    records the signal, and the compile stage's wait raises it within its tick (a Ray build
    Ctrl-C'd twice finished and exited 0, tests/test_ray_farm.py)."""
    from concurrent.futures import Future

    from pypto_offline.errors import BuildInterrupted
    from pypto_offline.pypto_kernels.jobs import pool

    class Finalised:
        def __del__(self):
            pool.interrupt(signal.SIGINT, None)

    pool.forget_interrupts()
    try:
        Finalised()  # its __del__ runs now; the BuildInterrupted it raises is lost here
        with pytest.raises(BuildInterrupted) as raised:
            pool.wait_interruptibly([Future()])  # a future never done
        assert raised.value.signum == signal.SIGINT
    finally:
        pool.forget_interrupts()
