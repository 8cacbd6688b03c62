"""The three kinds of kernel cache entry, each with its own key, file and check
(docs/kernel-cache.md, "An entry"):

- a region's **kernel** (``kernel.json`` and the shipped compile's artifacts): what a build
  ships for a region, keyed by every candidate's source, the interface and the search rules;
- one **compile** of one candidate (``result.json``, and a checked compile's artifacts): what
  PyPTO made of a source, shared by every region, model and target of the same platform;
- one op's **op cost** (``op_cost.json``): its best time alone, the measured baseline.

An entry is read back only when it is the one this build would store: the manifest shows its
files are as stored, and each kind checks that they say what this build would compute.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from pypto_offline.pypto_kernels.cache import DamagedEntry, KernelCache, cache_key
from pypto_offline.pypto_kernels.jobs.protocol import WORK, CandidateResult, FailureKind
from pypto_offline.pypto_kernels.records import Kernel, TileResult, legacy_fallback_kind
from pypto_offline.pypto_kernels.tiling import SEARCH_RULES, TilePolicy
from pypto_offline.pypto_kernels.platform import platform_of
from pypto_offline.pypto_kernels.versions import KERNEL_FORMAT, PYPTO_VERSION

KERNEL_FILE, COMPILE_FILE, OP_COST_FILE = "kernel.json", "result.json", "op_cost.json"
# An entry's kind by the file that only it has (``cache info``'s count by kind).
KIND_OF_FILE = {KERNEL_FILE: "kernels", COMPILE_FILE: "compiles", OP_COST_FILE: "op_costs"}
ARTIFACTS = "final/artifacts/"  # in a kernel's entry: the shipped compile's artifacts
CHOSEN_ARTIFACTS = "chosen-artifacts"  # in its staging folder, until ``save_kernel`` places them
# In a kernel's staging folder: what a compile leaves that is not kept (the simulator's bulky
# output, the other checked candidates' artifacts, the data any build derives again).
NOT_KEPT = (WORK, "ascend_log", "artifacts")
DERIVED = ("inputs.npz", "reference.npz")
# What a compile of one candidate says about it, whatever the target it was compiled for: the
# fields a compile entry keeps (not the worker's timing or its run folder).
COMPILE_FIELDS = ("compiled", "error", "aicore_us", "total_us", "tasks", "ub_bytes", "gm_bytes",
                  "verdicts", "max_abs_diff", "magnitude")


def kernel_key(sources: dict[TilePolicy, str], interface: list, target, default_budget: int
               ) -> str:
    return cache_key(sources={p.name: text for p, text in sources.items()}, interface=interface,
                     target=target.name, pypto=PYPTO_VERSION, format=KERNEL_FORMAT,
                     default=default_budget, platform=platform_of(target).digest,
                     search=SEARCH_RULES)


def compile_key(source: str, interface: list, verify: bool, target) -> str:
    return cache_key(compile_source=source, interface=interface, verify=verify,
                     pypto=PYPTO_VERSION, format=KERNEL_FORMAT,
                     platform=platform_of(target).digest)


def op_cost_key(sources: dict[TilePolicy, str], interface: list, target) -> str:
    # its own by ``unfused_op`` (and unchanged since op costs were kept in kernel.json files:
    # the key names the job's modules, whose sources must stay as they were)
    return cache_key(unfused_op=sorted(f"{p.name}:{t}" for p, t in sources.items()),
                     interface=interface, target=target.name, pypto=PYPTO_VERSION,
                     format=KERNEL_FORMAT, platform=platform_of(target).digest)


# -- kernels ------------------------------------------------------------------------------------

def save_kernel(kernel: Kernel, staged: Path) -> None:
    """A kernel's entry in its staging folder: the chosen compile's artifacts (``ARTIFACTS``)
    and its record, the rest of what its search left removed."""
    for name in (p.name for p in staged.iterdir() if p.is_dir() and p.name != CHOSEN_ARTIFACTS):
        for bulky in NOT_KEPT:
            shutil.rmtree(staged / name / bulky, ignore_errors=True)
        for data in DERIVED:  # re-derived by any build; every stored byte is hashed on each read
            (staged / name / data).unlink(missing_ok=True)
    if (staged / CHOSEN_ARTIFACTS).is_dir():
        (staged / "final").mkdir(exist_ok=True)
        (staged / CHOSEN_ARTIFACTS).rename(staged / ARTIFACTS)
    record = {k: v for k, v in kernel.__dict__.items()
              if k not in ("artifacts", "from_cache", "pypto_compiles")}
    for tile in ("default_tile", "tuned_tile"):
        if record[tile] is not None:
            record[tile] = record[tile].__dict__
    record["candidates"] = [c.__dict__ for c in record["candidates"]]
    if kernel.fallback_kind is None:  # a kernel that shipped: its entry as it always was
        record.pop("fallback_kind")
    else:
        record["fallback_kind"] = kernel.fallback_kind.value
    (staged / KERNEL_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))


def load_kernel(files: dict[str, bytes], region_id: str, from_cache: bool) -> Kernel:
    """An entry's kernel (from its files, by relative path) as ``region_id``'s: an entry serves
    every region with the same work."""
    record = json.loads(files[KERNEL_FILE])
    for tile in ("default_tile", "tuned_tile"):
        if record[tile] is not None:
            record[tile] = TileResult(**record[tile])
    record["candidates"] = tuple(TileResult(**c) for c in record["candidates"])
    record["verdicts"] = tuple(tuple(v) for v in record["verdicts"])
    record["fallback_kind"] = _stored_kind(record)
    artifacts = {name[len(ARTIFACTS):]: data for name, data in files.items()
                 if name.startswith(ARTIFACTS)}
    return Kernel(**{**record, "region_id": region_id}, artifacts=artifacts,
                  from_cache=from_cache)


def _stored_kind(record: dict) -> FailureKind | None:
    """The kind an entry records; an entry stored before kinds were recorded (format 22 before
    this field) gives it by its reason's first words, the one place they are read."""
    if record.get("fallback_kind") is not None:
        return FailureKind(record["fallback_kind"])
    return legacy_fallback_kind(record.get("fallback_reason"))


def cached_kernel(files: dict[str, bytes], region_id: str, key: str,
                  sources: dict[TilePolicy, str],
                  source_of: Callable[[TilePolicy], str | None]) -> Kernel:
    """A kernel entry, if it is the one this build would compile: stored under this key and
    from the very source generated now for its tile (the manifest only shows the files are as
    they were stored)."""
    kernel = load_kernel(files, region_id, from_cache=True)
    if kernel.cache_key != key:
        raise DamagedEntry("its kernel.json names another key")
    tile = kernel.tuned_tile
    expected = (source_of(TilePolicy(tile.budget_bytes, tile.swapped_transposes,
                                     tile.flat_rows, tile.vec_merge)) if tile is not None
                else kernel.source if kernel.source in sources.values() else None)
    if kernel.source != expected:
        raise DamagedEntry("its kernel source is not the one generated for this build")
    return kernel


# -- compiles -----------------------------------------------------------------------------------

def store_compile(cache: KernelCache, key: str, answer: CandidateResult) -> dict:
    """A compile's entry: its figures, and a checked compile's artifacts (the worker's
    ``artifacts`` folder for that candidate)."""
    entry = cache.staging()
    given = answer.to_dict()
    record = {name: given[name] for name in COMPILE_FIELDS if name in given}
    (entry / COMPILE_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
    if answer.compiled and answer.artifacts:
        shutil.copytree(answer.artifacts, entry / "artifacts")
    return cached_compile(cache.put(key, entry))


def cached_compile(files: dict[str, bytes]) -> dict:
    """A compile entry: ``result`` (its figures) and ``artifacts`` (relative path → bytes)."""
    result = json.loads(files[COMPILE_FILE])
    if not isinstance(result, dict) or set(result) - set(COMPILE_FIELDS):
        raise DamagedEntry("its compile result holds unknown fields")
    return {"result": result, "artifacts": {name[len("artifacts/"):]: data
                                            for name, data in files.items()
                                            if name.startswith("artifacts/")}}


# -- op costs -----------------------------------------------------------------------------------

def op_cost_record(us: float | None, sources: dict[TilePolicy, str]) -> dict:
    """A single op's measured baseline: its best time and the sources it was measured on."""
    return {"unfused_us": us, "sources": {p.name: text for p, text in sources.items()}}


def store_op_cost(cache: KernelCache, key: str, us: float | None,
                  sources: dict[TilePolicy, str]) -> None:
    entry = cache.staging()
    (entry / OP_COST_FILE).write_text(json.dumps(op_cost_record(us, sources), indent=1,
                                                 sort_keys=True))
    cache.put(key, entry)


def cached_op_cost(files: dict[str, bytes], sources: dict[TilePolicy, str]) -> dict:
    """An op cost entry (its ``unfused_us``, None when no tile compiled), if it is the one
    this build would measure. pypto-offline before issue 33 stored the same record under the
    kernel's file name; the key alone says what an entry is (each kind has its own key
    fields), so such an entry is read as it is, not measured again."""
    name = OP_COST_FILE if OP_COST_FILE in files else KERNEL_FILE
    record = json.loads(files[name]) if name in files else None
    if not isinstance(record, dict) or set(record) != set(op_cost_record(None, {})):
        raise DamagedEntry(f"it holds no op cost record ({OP_COST_FILE})")
    if record["sources"] != op_cost_record(None, sources)["sources"]:
        raise DamagedEntry("its kernel sources are not the ones generated for this build")
    if not isinstance(record["unfused_us"], (int, float, type(None))):
        raise DamagedEntry("its time is not a number")
    return record
