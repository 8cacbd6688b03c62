"""What a compile's output says, read in the worker: the cost model's times, the GM traffic and
UB peak counted from ``program.json``, the pass-verify verdicts, the buffer a pass refused (in
PyPTO's log), and the artifacts kept in a form that is the same bytes on every machine
(docs/figures.md)."""
from __future__ import annotations

import contextlib
import csv
import ctypes
import gc
import glob
import gzip
import json
import os
from pathlib import Path

import numpy as np

TILE_GRAPH, LEAF_GRAPH = 1, 3  # program.json graphtypes: the tile graph, a leaf (AICore) function
CYCLES_PER_US = 1800.0  # the simulator's swim-lane time base (1.8 GHz)
MEM_DEVICE_DDR = 15  # program.json mem_type of a global-memory tensor (tilefwk/data_type.h)
MEM_UB = 0  # ... and of a Unified Buffer one (pypto.pypto_impl.MemoryType.MEM_UB)
# pypto DataType codes (pypto.DT_*) → bytes per element, for counting copies in program.json
DT_BYTES = {0: 0.5, 1: 1, 2: 2, 3: 4, 4: 8, 5: 1, 6: 2, 7: 4, 8: 2, 11: 1, 12: 2, 13: 4, 14: 8,
            15: 1, 16: 8, 17: 1, 18: 1, 19: 1}


def cost_of(run_dir: Path) -> dict:
    simulation = run_dir / "CostModelSimulationOutput"
    result = {"aicore_us": None, "total_us": None, "tasks": 0}
    swim = simulation / "_simulate.swim.json"
    if swim.exists():
        starts, ends = [], []
        for core in json.loads(swim.read_text()):
            if core.get("coreType") in ("AIC", "AIV"):
                for task in core["tasks"]:
                    starts.append(task["execStart"])
                    ends.append(task["execEnd"])
        result["tasks"] = len(starts)
        if starts:
            result["aicore_us"] = round((max(ends) - min(starts)) / CYCLES_PER_US, 3)
    report = simulation / "_simulate.stat.report.txt"
    if report.exists():
        for line in report.read_text().splitlines():
            if line.startswith("Total Cycles"):
                result["total_us"] = round(int(line.split(":")[-1]) / CYCLES_PER_US, 3)
    return result


def copy_traffic(program: dict) -> dict:
    """Global-memory bytes the compiled program moves (docs/figures.md): every operation of the
    tile graphs with an operand in GM (COPY_IN, COPY_OUT, TRANSPOSE_MOVEOUT, ...), each GM operand
    counted once, read when it is an input and written when it is an output. The elements moved
    are the local side's valid shape (the GM operand is the whole tensor), the bytes per element
    the GM tensor's dtype: what crosses the bus is what GM holds, whatever a local buffer stages."""
    read = written = 0
    for function in program["functions"]:
        if function.get("graphtype") != TILE_GRAPH:
            continue
        tensors = {t["magic"]: t for t in function["tensors"]}
        dtypes = {r["rawmagic"]: r["datatype"] for r in function["rawtensors"]}
        for op in function["operations"]:
            sides = {"in": [tensors[m] for m in op.get("ioperands", [])],
                     "out": [tensors[m] for m in op.get("ooperands", [])]}
            for side, other in (("in", "out"), ("out", "in")):
                local = [t for t in sides[other] if not in_gm(t)]
                for tensor in filter(in_gm, sides[side] if local else ()):
                    nbytes = int(_elements(local[0]) * DT_BYTES.get(dtypes[tensor["rawtensor"]], 4))
                    if side == "in":
                        read += nbytes
                    else:
                        written += nbytes
    return {"read": read, "written": written}


def in_gm(tensor: dict) -> bool:
    """Whether a program.json tensor lives in global memory (MemoryType MEM_DEVICE_DDR)."""
    return tensor.get("mem_type", {}).get("tobe") == MEM_DEVICE_DDR


def _elements(tensor: dict) -> int:
    return int(np.prod(tensor.get("validshape") or tensor["shape"], dtype=np.int64))


def ub_peak(program: dict) -> int:
    """The most Unified Buffer any leaf function of the compiled program allocates: the end of
    the highest UB range its local tensors occupy. Only UB (``MemoryType.MEM_UB``): a cube
    leaf's L1, L0A/L0B/L0C and bias-table tensors have ranges of their own, which PyPTO checks
    against those buffers when it compiles (a 196x128 fp32 product's L0C tile ends at 128 KiB
    and once refused 16 matmul kernels of swin as if it were UB; docs/pypto-ops.md)."""
    peak = 0
    for function in program["functions"]:
        if function.get("graphtype") != LEAF_GRAPH:
            continue
        for tensor in function["tensors"]:
            if tensor.get("mem_id", -1) >= 0 and tensor.get("mem_range") \
                    and tensor.get("mem_type", {}).get("tobe") == MEM_UB:
                peak = max(peak, int(tensor["mem_range"][1]))
    return peak


def verdicts(verify_dir: Path) -> list[dict]:
    ctypes.CDLL(None).fflush(None)  # the CSVs are written through buffered C streams
    rows = []
    for path in sorted(verify_dir.glob("**/verify_result_brief.csv")):
        with open(path) as handle:
            rows.extend({"pass": r["passName"], "result": r["verifyResult"],
                         "max_abs_diff": r.get("maxAbsDiff")} for r in csv.DictReader(handle))
    return rows


def read_program(path: Path) -> dict:
    """A compiled ``program.json`` (several MB: 8 MB for a 65-task magika kernel), parsed with the
    garbage collector paused: the parse only allocates (no cycles to find), but each allocation
    burst triggers collections that walk every young object, and on their way up every object
    of the process. Measured 0.67-1.16 s → 0.20-0.36 s for 8 MB (docs/compile-time.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(path.read_text())
    finally:
        if was_enabled:
            gc.enable()


def keep_artifacts(run_dir: Path, target: Path, paths: dict[str, str]) -> None:
    """program.json (gzipped), the task graph, the host control-flow and AICore sources, with
    absolute paths (the build folder, the pypto package) replaced by portable names so that
    the same kernel gives the same bytes whatever the cache folder or machine."""
    target.mkdir(parents=True, exist_ok=True)
    files = {"program.json": run_dir / "program.json", "dyn_topo.txt": run_dir / "dyn_topo.txt"}
    for source in glob.glob(str(run_dir / "kernel_aicpu" / "controlFlow_host_*.cpp")):
        files["control_flow_host.cpp"] = Path(source)
    for source in sorted(glob.glob(str(run_dir / "kernel_aicore" / "*.cpp"))):
        files[Path(source).name] = Path(source)
    for name, path in files.items():
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        for absolute, portable in paths.items():
            text = text.replace(absolute, portable)
        if name == "program.json":
            with open(target / "program.json.gz", "wb") as packed, \
                    gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, filename="") as z:
                z.write(text.encode())  # mtime 0, no name: the same bytes on every build
        else:
            (target / name).write_text(topology_once(text) if name == "dyn_topo.txt" else text)


def topology_once(text: str) -> str:
    """``dyn_topo.txt`` with its tasks listed once. PyPTO's emulator, on a loaded machine, now
    and then writes a run's whole task list twice into the file (its header once, then every
    line twice over, in the same order; each line names its task, so a true list repeats
    none): 3 checked compiles in 18 cold builds of tf_swin, 8 with the code before the heap fix
    and 10 after, the kernel's figures those of the single list. The copy is dropped."""
    header, *tasks = text.splitlines(keepends=True) or [""]
    half = len(tasks) // 2
    if half and len(tasks) == 2 * half and tasks[:half] == tasks[half:]:
        return header + "".join(tasks[:half])
    return text


# PyPTO raises a bare "Errcode: FFFFFF!" when a pass finds a tile too large for a buffer of its
# platform; which buffer, and by how much, is only in its log (docs/platform.md).
BUFFER_REFUSAL = "exceeds MEM_"


def log_sizes() -> dict[Path, int]:
    """The size of each of PyPTO's log files now: what a compile adds is read after it. A
    process logs to the file it opened first, which a job child inherits from its server (in
    the server's import log): the files this process holds open, and any in the job's log."""
    root = Path(os.environ.get("ASCEND_PROCESS_LOG_PATH", "."))
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held.add(Path(os.readlink(f"/proc/self/fd/{fd}")))
    paths = {p for p in held if p.suffix == ".log" and p.parent.name == "plog"}
    paths |= set(root.rglob("*.log"))
    return {path: path.stat().st_size for path in paths if path.is_file()}


def buffer_refusal(before: dict[Path, int]) -> str | None:
    """The first buffer PyPTO's passes refused in the log lines written since ``before``:
    "Alloc tensor [51] size [32768] exceeds MEM_L0A size [0]!", or None."""
    ctypes.CDLL(None).fflush(None)  # PyPTO's log is a C stream: out of its buffer first
    for path, size in sorted(log_sizes().items()):
        with open(path, "rb") as log:
            log.seek(before.get(path, 0))
            for line in log.read().decode(errors="replace").splitlines():
                if BUFFER_REFUSAL in line:
                    return line.split("]:")[-1].strip()[:300]
    return None
