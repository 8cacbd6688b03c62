"""PyPTO compiles in forked children of a fork server:
``python -m pypto_offline.pypto_kernels.worker --serve FOLDER``.

PyPTO segfaults under threads, its artifacts drift within a process, and a failed compile leaves
its process unusable, so every job runs in a fresh child, alone. The server imports torch and
pypto once (``start_pypto``) and forks one child per job (``serve``). A job holds generated
modules (one or several tile candidates), input and reference arrays, and a folder; the result
is ``result.json`` in that folder. All of PyPTO's output (its simulator, logs, side files) stays
inside the folder. The server says ``ready`` once torch and pypto are imported; servers and
children die with their build, and so do PyPTO's own child processes (``guard_process_group``;
docs/workers.md).

Of the compiler it imports the job protocol only (``jobs/protocol.py``); the package imports the
stages (docs/determinism.md, "What the fork server imports": they reach the kernels' bytes).

Recipes (docs/pypto-recipes.md):
- a quiet simulator config through ``TILEFWK_CONFIG_PATH``;
- the pass-verify input hand-over fix, with the calculator built once into a shared cache;
- the AICore end-to-end time from ``_simulate.swim.json``;
- the target's platform: an overlay first on the path, its machine in the simulator
  (platform.py); the A5 cost tables for ascend950.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import linecache
import os
import select
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from pypto_offline.pypto_kernels import host_compiler_cache
from pypto_offline.pypto_kernels.jobs.protocol import (ARGUMENT_SHAPES, OUTPUTS_FILE, PAD,
                                                       PR_SET_PDEATHSIG, SERVER_READY,
                                                       STARTED_MARKER, WORK,
                                                       crashed, workspace)
from pypto_offline.pypto_kernels.worker_setup import (enable_functional_check,
                                                      keep_aicore_sources, load_calculator,
                                                      overlay_first, prepare_environment,
                                                      pypto_lib)
from pypto_offline.pypto_kernels.program_figures import (buffer_refusal, cost_of, copy_traffic,
                                                         keep_artifacts, log_sizes,
                                                         read_program, ub_peak, verdicts)



PID_DIGITS = 7  # a Linux pid has at most 7 (pid_max is at most 2**22)
INHERITED_PATH = os.environ.get("PATH", "")  # read at import, in the server: before any job's


def run_folder_name() -> str:
    """The folder PyPTO makes its run folder in (TILE_FWK_OUTPUT_DIR), named so that the run
    folder's path has one length: PyPTO names it ``output_<time>_<pid>_<host address>``, and
    this name takes up the digits the pid lacks of ``PID_DIGITS``."""
    return "run" + PAD * max(0, PID_DIGITS - len(str(os.getpid())))


def enter_workspace(job: dict, folder: Path, index: int) -> Path:
    """A candidate's own working folder (``workspace``), made the current one, with everything
    PyPTO reads at each compile pointing into it: its home, its run folder, the pass-verify
    dumps, the g++ wrapper and the bisheng stand-in on PATH. Returns the folder."""
    space = workspace(folder / WORK, f"c{index}")
    space.mkdir(parents=True)
    os.chdir(space)
    # the g++ wrapper's settings name this folder (docs/kernel-cache.md)
    tools = [host_compiler_cache.install(space, job.get("host_compiler_cache"), folder,
                                         job.get("cache_group"))]
    if job.get("verify"):
        tools.append(keep_aicore_sources(space))
        # the kernel's module reads it as it runs: it turns pass-verify on
        os.environ["PYPTO_OFFLINE_VERIFY_DIR"] = str(space / "verify")
    os.environ["PYPTO_HOME"] = str(space / "pypto_home")
    os.environ["TILE_FWK_OUTPUT_DIR"] = str(space / run_folder_name())
    os.environ["PATH"] = os.pathsep.join([str(t) for t in tools if t] + [INHERITED_PATH])
    return space


def _in_fresh_thread(work: Callable[[], object]):
    """``work()`` (a compile) in a thread of its own, after a full collection; its exception
    raised here (protocol.WORKSPACE_CHARS says why the compile's heap matters). glibc gives the
    thread a malloc arena apart from the main heap: what PyPTO allocates does not land in the
    holes this process's history (the server's earlier jobs, the job's own paths and files) left
    there, nor, with the thread cache off (processes.worker_environment), in chunks of it that
    the compile frees. The collection sets the collector's counters to zero, so that its
    collections during the compile free PyPTO's objects at the same points. Measured on
    tf_swin's region_16: without the thread, its artifacts changed with the server's job count;
    with it but without the collection, they still took two forms."""
    gc.collect()
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - raised again in the calling thread
            outcome["error"] = error
    thread = threading.Thread(target=run, name="pypto-compile")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _load_kernel(candidate: dict, name: str):
    """The candidate's generated module, run from the source text in the job under its fixed
    virtual file name (``kernel/<key>_<tile>.py``): no file on disk is imported, so nothing
    planted in a shared folder can run here, and the name PyPTO writes into program.json is the
    same on every build. PyPTO's parser reads the function back through ``inspect``, which finds
    the text in ``linecache`` (an entry without mtime is never re-read from disk). See
    docs/kernel-cache.md."""
    filename, text = candidate["module"], candidate["source"]
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    # A copy the worker reads nothing from, for PyPTO's parser errors: they quote the offending
    # line by opening the file (a missing one turns the reason into a FileNotFoundError). The
    # name is relative, so the copy lands in this job's own private folder (the worker's cwd).
    copy = Path(filename)
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text)
    module = types.ModuleType(f"pypto_offline_kernel_{name}")
    module.__file__ = filename
    # dont_inherit: this file's ``from __future__ import annotations`` would turn the kernel's
    # pypto.Tensor annotations into strings, which PyPTO then takes for non-tensor parameters
    code = compile(text, filename, "exec", dont_inherit=True)
    exec(code, module.__dict__)  # noqa: S102 - the generated kernel, from this build's job
    return getattr(module, name), getattr(module, ARGUMENT_SHAPES, None)


def as_arguments(tensors: list, declared) -> list:
    """The argument tensors in the shapes the kernel declares (``codegen.ARGUMENT_SHAPES``, when
    some argument is declared folded): the same elements in the same order, viewed."""
    if declared is None:
        return tensors
    if len(declared) != len(tensors) or any(
            int(np.prod(shape)) != t.numel() for t, shape in zip(tensors, declared)):
        raise ValueError(f"the kernel declares arguments {declared}, not the job's "
                         f"{[tuple(t.shape) for t in tensors]}")
    return [t.reshape(tuple(shape)) for t, shape in zip(tensors, declared)]


def _compile_once(job: dict, candidate: dict, folder: Path, arrays: list, torch) -> dict:
    """Compile (and run) one candidate in the working folder ``enter_workspace`` made current,
    in a fresh thread (``_in_fresh_thread``)."""
    outputs = [torch.zeros(tuple(o["shape"]) or (1,), dtype=getattr(torch, o["dtype"]))
               for o in job["outputs"]]
    inputs = [torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape or (1,))) for a in arrays]
    run_root = Path(os.environ["TILE_FWK_OUTPUT_DIR"])
    run_root.mkdir(parents=True, exist_ok=True)
    before = set(run_root.glob("output_*"))
    logged = log_sizes()
    started = time.perf_counter()
    try:
        _in_fresh_thread(partial(_run_kernel, job, candidate, folder, inputs, outputs, torch))
    except MemoryError:
        raise  # the machine's state, not the kernel's: the worker dies, nothing is cached
    except Exception as error:  # noqa: BLE001 - any failure is this candidate's verdict
        # (not BaseException: a Ctrl-C or exit must kill the worker, not pass as a verdict)
        refusal = buffer_refusal(logged)
        return {"compiled": False,
                "error": _first_line(error) + (f" ({refusal})" if refusal else ""),
                "seconds": round(time.perf_counter() - started, 3)}
    seconds = time.perf_counter() - started
    run_dirs = sorted(set(run_root.glob("output_*")) - before)
    result = {"compiled": True, "seconds": round(seconds, 3), "run_dir": str(run_dirs[-1])}
    result.update(cost_of(run_dirs[-1]))
    program = run_dirs[-1] / "program.json"
    if program.exists():
        compiled = read_program(program)
        result["gm_bytes"] = copy_traffic(compiled)
        result["ub_bytes"] = ub_peak(compiled)
    result["outputs"] = [o.numpy().reshape(tuple(spec["shape"])) for o, spec in
                         zip(outputs, job["outputs"])]
    return result


def _run_kernel(job: dict, candidate: dict, folder: Path, inputs: list, outputs: list,
                torch) -> None:
    """Load the candidate's kernel and call it on ``inputs`` + ``outputs``: PyPTO compiles it,
    runs it in SIM mode (writing ``outputs``) and, with ``verify``, checks it."""
    kernel, declared = _load_kernel(candidate, job["function"])
    arguments = as_arguments(inputs + outputs, declared)
    if job.get("verify") and not (job.get("original_reference") or job.get("save_outputs")):
        import pypto  # PyPTO compares them too (a run of the reference runtime has none)

        reference = np.load(folder / "reference.npz")
        goldens = [torch.from_numpy(np.ascontiguousarray(reference[f"out{i}"]).reshape(
            tuple(argument.shape))) for i, argument in enumerate(arguments[len(inputs):])]
        pypto.set_verify_golden_data(goldens=[None] * len(inputs) + goldens)
    kernel(*arguments)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


# What a candidate says about the kernel it compiles, as opposed to its tile policy.
KERNEL_FIELDS = ("source", "module", "function", "inputs", "outputs")


def start_pypto(folder: Path, platform: dict, calculator_cache: Path):
    """The platform's overlay first on the path, environment, ``import torch`` and ``import
    pypto``, the functional-check fix and its calculator: what every job needs, done once by
    the fork server. Returns the torch module."""
    overlay = None if platform["native"] else overlay_first(folder, platform["file_text"])
    prepare_environment(folder, platform)
    import torch

    pypto = importlib.import_module("pypto")  # loads the framework with the environment above
    if overlay is not None and Path(pypto.__file__).parent != overlay / "pypto":
        raise RuntimeError(f"pypto was imported from {pypto.__file__}, not from the platform "
                           f"overlay {overlay}: its figures would be the 910B's")

    enable_functional_check(calculator_cache)
    load_calculator(calculator_cache)  # once, here: a forked job then only uses it
    return torch


def run_job(job: dict, torch) -> dict:
    """Compile (and check) the candidates of a job, in a process where ``start_pypto`` ran: in
    order, up to the first that fails (the ones after it are left out of the answer); or each
    in a process of its own (``_in_processes``), ``parallel`` at a time, for a job the build
    gives ``parallel`` > 1 and for a checked job of several: its artifacts ship, and PyPTO's
    drift within a process (symbol numbers) would make a candidate's depend on those before."""
    folder = Path(job["folder"])
    if len(job["candidates"]) > 1 and (job.get("parallel", 1) > 1 or job.get("verify")):
        return _in_processes(job, folder, torch, job.get("parallel", 1))
    results, data = [], np.load(folder / "inputs.npz")
    for index in range(len(job["candidates"])):
        results.append(_candidate(job, index, folder, torch, data))
        if not results[-1]["compiled"]:  # PyPTO is unusable in this process now ("function
            break  # nested is not allowed"): the candidates left run in a fresh child (compiler)
    return {"candidates": results}


def _candidate(job: dict, index: int, folder: Path, torch, data) -> dict:
    """One candidate of a job compiled (and checked) in a working folder of its own
    (``enter_workspace``), as the build reads it back; ``data``: the job's ``inputs.npz``,
    opened by this process (an open archive's file offset is shared with a forked process)."""
    candidate = job["candidates"][index]
    shared = [f"in{i}" for i in range(len(data.files))]  # one kernel's inputs, in order
    # a candidate may be a kernel of its own (the unfused baseline compiles one per op)
    arrays = ([data[name] for name in candidate["inputs"]] if "inputs" in candidate
              else [data[name] for name in shared] if set(shared) == set(data.files) else [])
    own = {**job, **{k: candidate[k] for k in ("function", "outputs") if k in candidate}}
    # each checked candidate's artifacts in a folder of its own: a job may check several (the
    # first round of a small region's tile search, docs/compile-time.md)
    space, kept = enter_workspace(job, folder, index), folder / "artifacts" / f"c{index}"
    result = _compile_once(own, candidate, folder, arrays, torch)
    outputs = result.pop("outputs", None)
    if job.get("verify") and outputs is not None:  # pass-verify's interpreter filled them
        result["verdicts"] = verdicts(space / "verify")
    if job.get("save_outputs") and outputs is not None:  # a run: its outputs are the answer
        np.savez(folder / OUTPUTS_FILE, **{f"out{i}": o for i, o in enumerate(outputs)})
    elif job.get("verify") and outputs is not None:
        result.update(_compare(outputs, folder / "reference.npz",
                               job.get("saturated_outputs", ())))
        # longest first: the run folder (named with a timestamp and pid) is inside the working
        # folder, which is inside `folder`
        portable = {result["run_dir"]: "<build>/run", str(space): "<build>",
                    str(pypto_lib().parent): "<pypto>", str(folder.resolve()): "<build>"}
        keep_artifacts(Path(result["run_dir"]), kept, portable)
        result["artifacts"] = str(kept)
    # handed back as given (its tile policy, whatever fields it has), less the kernel itself
    tile = {k: v for k, v in candidate.items() if k not in KERNEL_FIELDS}
    return {**tile, "function": own["function"], **result}


def _in_processes(job: dict, folder: Path, torch, parallel: int) -> dict:
    """Each candidate compiled in a child of this job's process, ``parallel`` at a time (the
    build asks for more than one when a pool thread would idle: a model of one region, the
    last region of a build; a checked job's candidates each need a fresh process). Each child
    starts from this process's state, which has compiled nothing; its PyPTO output goes to a
    working folder of its own; a failure dies with its child. A child that dies without an
    answer makes the whole job's outcome transient, as a worker's crash does."""
    pending, running, codes = list(range(len(job["candidates"]))), {}, {}
    while pending or running:
        while pending and len(running) < parallel:
            index = pending.pop(0)
            running[_forked(partial(_candidate_child, job, index, folder, torch))] = index
        pid, status = os.wait()
        codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    answers = []
    for index in range(len(job["candidates"])):
        path = folder / f"candidate{index}.json"
        if codes[index] != 0 or not path.exists():
            return crashed(f"exit code {codes[index]}").to_dict()
        answers.append(json.loads(path.read_text()))
    return {"candidates": answers}


def _candidate_child(job: dict, index: int, folder: Path, torch) -> None:
    """In a candidate's child: its answer in the job's folder."""
    answer = _candidate(job, index, folder, torch, np.load(folder / "inputs.npz"))
    _write_json(answer, folder / f"candidate{index}.json")


def _forked(body: Callable[[], None]) -> int:
    """Fork a child that runs ``body`` and exits (0 when it returned, 1 when it raised, the
    exception told in the log): nothing in the child returns into the parent's code, and
    nothing buffered is written twice. Returns the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        body()
        code = 0
    except BaseException:  # noqa: BLE001 - the child's end, told in its log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _compare(outputs: list, reference: Path, saturated: list[int]) -> dict:
    """The kernel's outputs against the reference's (``runtime.kernel_check``; against the
    original model's values, the outputs ``Job.saturated_outputs`` lists as fp16 tells them)."""
    from pypto_offline.runtime import kernel_check

    expected = np.load(reference)
    return kernel_check([expected[f"out{index}"] for index in range(len(outputs))], outputs,
                        saturating=[index in saturated for index in range(len(outputs))])


def guard_process_group() -> int | None:
    """Fork a sentinel that SIGKILLs this process's group as soon as its parent (the build for a
    fork server, the server for a job's child) or the process itself is gone; returns its pid
    (None when the process does not lead a group of its own, as when run by hand: its group is
    then someone else's).

    The build's PDEATHSIG kills the worker only: PyPTO's children (host g++, the calculator's
    cmake) do not inherit it and would run on as orphans. A thread cannot do the sweeping, as
    PyPTO's C++ may hold the GIL for the whole compile; a process of its own waits in the kernel
    (pidfds) and needs nothing from the worker."""
    worker, build = os.getpid(), os.getppid()  # under PDEATHSIG, the parent is still the build
    if os.getpgrp() != worker:
        return None
    try:
        watched = [os.pidfd_open(build), os.pidfd_open(worker)]
    except (AttributeError, OSError):  # Linux < 5.3: poll for the worker's death instead
        watched = []
    sentinel = os.fork()
    if sentinel:
        for fd in watched:
            os.close(fd)
        return sentinel
    try:  # the sentinel: nothing here may return into the worker's code
        if watched:
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN)
            poller.poll()
        else:
            while os.getppid() == worker:
                time.sleep(0.2)
    finally:
        os.killpg(worker, signal.SIGKILL)
        os._exit(0)


def enter_job(folder: Path, server: Path) -> None:
    """In a job's child: PyPTO's side files go into the job's folder (its per-compile output
    into each candidate's working folder: ``enter_workspace``). The log folder was fixed at
    import, so its name (a symbolic link in the server's folder) is pointed at the job's own. A
    copy of the config the server imported with stays with the job (docs/workers.md)."""
    (folder / "ascend_log").mkdir(exist_ok=True)
    link = server / "ascend_log"
    staged = server / "ascend_log.tmp"
    staged.unlink(missing_ok=True)
    os.symlink(folder / "ascend_log", staged)
    os.replace(staged, link)  # the server runs one job at a time: nobody else writes through it
    (folder / "tile_fwk_config.json").write_bytes((server / "tile_fwk_config.json").read_bytes())


def _write_json(value: dict, path: Path) -> None:
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(staged, path)


def die_on_interrupts() -> None:
    """SIGINT and SIGTERM end this process at once, as the kernel's default action: never a
    Python exception, which PyPTO's frontend may catch and turn into a compile error that the
    cache would keep as the kernel's verdict (a job interrupted with ``kill -INT`` then fell
    back in every later build). The build trusts only a child that exited 0
    (``jobs.executor.LocalExecutor``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _job_child(job_path: Path, server: Path, torch, libc, started: int, server_pid: int) -> None:
    """A forked job: a session of its own (the build kills its process group on a time-out),
    dead when the server dies (PDEATHSIG, and a sentinel for PyPTO's children), output in the
    job folder. Tells the server through ``started`` once its group exists."""
    os.setsid()
    die_on_interrupts()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before the line above
        os._exit(1)
    sentinel = guard_process_group()
    os.write(started, b"\n")
    os.close(started)
    try:
        job = json.loads(job_path.read_text())
        folder = Path(job["folder"])
        os.chdir(folder)
        log = os.open(folder / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        enter_job(folder, server)
        (folder / STARTED_MARKER).touch()  # the environment works: a death is the kernel's
        _write_json(run_job(job, torch), job_path.with_name("result.json"))
    finally:
        if sentinel:
            os.kill(sentinel, signal.SIGKILL)
            os.waitpid(sentinel, 0)


def serve(folder: Path) -> int:
    """The fork server (docs/workers.md): imports torch and pypto once, says ``ready``, then for
    each job path read on stdin forks one child that runs the job and exits; replies
    ``<pid>`` once the child leads its own session and ``<pid> <exit code>`` once it is reaped
    (a negative code: killed by that signal). The server itself compiles nothing and runs no
    torch op: a failed compile leaves PyPTO unusable, and torch's thread pools do not survive
    a fork."""
    settings = json.loads((folder / "server.json").read_text())
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # stdout stays for what PyPTO prints
    os.dup2(2, 1)
    os.makedirs(folder / "import_log", exist_ok=True)
    os.symlink(folder / "import_log", folder / "ascend_log")
    torch = start_pypto(folder, settings["platform"], Path(settings["calculator_cache"]))
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: no dlopen in a forked child
    server_pid = os.getpid()
    # torch's and pypto's objects (~200k) out of every later collection: a child's collections
    # then walk only what its job made, and never write to (copy) the server's pages
    gc.freeze()
    replies.write(f"{SERVER_READY}\n")
    for line in sys.stdin:
        started, told = os.pipe()

        def job():  # runs in the child, at once
            os.close(started)
            os.close(replies.fileno())  # the build sees the server's death, not its children's
            _job_child(Path(line.strip()), folder, torch, libc, told, server_pid)
        pid = _forked(job)
        os.close(told)
        os.read(started, 1)  # empty when the child died first
        os.close(started)
        replies.write(f"{pid}\n")
        _, status = os.waitpid(pid, 0)
        replies.write(f"{pid} {os.waitstatus_to_exitcode(status)}\n")
    return 0


def main() -> int:
    """``python -m pypto_offline.pypto_kernels.worker --serve FOLDER``."""
    if len(sys.argv) != 3 or sys.argv[1] != "--serve":
        print(f"usage: python -m {__spec__.name} --serve FOLDER (with FOLDER/server.json); "
              "then one job.json path per line on stdin", file=sys.stderr)
        return 2
    sentinel = guard_process_group()
    try:
        return serve(Path(sys.argv[2]))
    finally:  # a finished server leaves no sentinel (nor a zombie) behind
        if sentinel:
            os.kill(sentinel, signal.SIGKILL)
            os.waitpid(sentinel, 0)


if __name__ == "__main__":
    sys.exit(main())
