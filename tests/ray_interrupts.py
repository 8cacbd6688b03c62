"""Run inside tests/test_ray_farm.py's cluster (its network namespace): a build on the farm is
interrupted by SIGINT, then SIGTERM, once its jobs are out; prints, per signal, the exit code and
the seconds from the signal to the exit, then whether the cluster got every CPU back (each job
actor holds one: an actor left alive would keep it).

    python -m tests.ray_interrupts ADDRESS MODEL CACHE_DIR"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.terminal import sigint_as_from_a_terminal

COMPILING = "compiling"  # the stage line after which jobs go to the farm
# Once an actor holds a CPU its job is out; its fork server imports torch and PyPTO meanwhile.
# (A fixed wait after the stage line missed the jobs once the example compiled within it.)
SERVER_STARTS_S = 2


def interrupted(address: str, model: str, cache: Path, number: int) -> tuple[int, float]:
    log = cache.with_suffix(f".{number}.log")
    with log.open("w") as err:
        build = subprocess.Popen(
            [sys.executable, "-m", "pypto_offline", model, "--target", "kirin9050",
             "--input-shape", "x=1,3,64,64", "--cache-dir", str(cache / str(number)),
             "--no-report", "--executor", "ray", "--ray-address", address],
            stdout=subprocess.DEVNULL, stderr=err, preexec_fn=sigint_as_from_a_terminal)
    deadline = time.monotonic() + 300
    while COMPILING not in log.read_text() and build.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    jobs_out(address, deadline)
    time.sleep(SERVER_STARTS_S)
    sent = time.monotonic()
    build.send_signal(number)
    time.sleep(0.3)
    seen = signal_state(build.pid, number)  # what became of it, shown where the exit is wrong
    try:
        code = build.wait(timeout=120)
    except subprocess.TimeoutExpired:
        build.kill()
        code = build.wait()
    return code, time.monotonic() - sent, seen


def signal_state(pid: int, number: int) -> str:
    """The signal's bit in the build's pending, blocked, ignored and caught sets 0.3 s after it
    was sent, and how many of its threads block it (/proc): what to look at when a Ctrl-C is
    lost (exit 0; docs/workers.md, "Interrupts")."""
    bit = 1 << (number - 1)
    try:
        fields = dict(line.split(":\t", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        blocking = sum(bool(int(dict(line.split(":\t", 1) for line in
                                     (task / "status").read_text().splitlines()
                                     if ":\t" in line)["SigBlk"], 16) & bit)
                       for task in tasks)
    except (OSError, KeyError, ValueError):
        return "(the build had exited)"
    flags = " ".join(f"{name} {int(fields[name], 16) & bit and 1}"
                     for name in ("ShdPnd", "SigPnd", "SigBlk", "SigIgn", "SigCgt"))
    return f"({flags}; {blocking} of {len(tasks)} threads block it)"


def jobs_out(address: str, deadline: float) -> None:
    """Until one of the build's job actors holds a CPU of the cluster (or the deadline)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
            return
        time.sleep(0.1)


def cpus_back(address: str) -> str:
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        free = ray.available_resources().get("CPU", 0)
        if free == ray.cluster_resources().get("CPU", 0):
            break
        time.sleep(0.5)
    return f"cpus free {free:g} of {ray.cluster_resources().get('CPU', 0):g}"


def main(address: str, model: str, cache: str) -> None:
    for number in (signal.SIGINT, signal.SIGTERM):
        code, seconds, seen = interrupted(address, model, Path(cache), number)
        print(f"interrupt {number.name} exit {code} after {seconds:.1f} s {seen}", flush=True)
    print(cpus_back(address), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
