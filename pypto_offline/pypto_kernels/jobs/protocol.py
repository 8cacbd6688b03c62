"""What crosses the process boundary between a build and its PyPTO workers: typed records, and
their JSON (``job.json`` in, ``result.json`` out) with the keys the workers have always read.

Standard library only: the worker (``pypto_kernels/worker.py``) imports this module and nothing
else of the kernel stage, so a fork server's imports do not depend on the compiler's.

A job is one region's tile candidates (or a batch of single ops for the measured baseline) to
compile in one worker child, with its inputs and onnxruntime's reference in its folder. The
answer says, per candidate, what PyPTO made of it; or why there is no answer (a ``Failure``).
Why a region fell back is a ``FailureKind``, carried as a value from where it happens to the
blob: never read back from a message's words (docs/architecture.md, "Jobs").
"""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from pypto_offline.progress import seconds_text

# The fork server's first line, once torch and pypto are imported: a server that dies before it
# never ran a compile, so its death says something about the environment, not about a region.
SERVER_READY = "ready"
# Written by a job's child in its folder before it compiles: from there a death is the kernel's.
STARTED_MARKER = "worker.started"
# In a job's folder: the working folder of each of its compiles (worker.enter_workspace), where
# PyPTO writes its run folder, home, pass-verify dumps; not kept in a kernel's entry.
WORK = "work"
JOB_FILE, RESULT_FILE = "job.json", "result.json"
# The files of a job's folder the build writes for it (the rest the job writes itself).
DATA_FILES = ("inputs.npz", "reference.npz")
# What a job asked for its outputs (``Job.save_outputs``) writes in its folder: the arrays the
# kernel's run filled, ``out0``, ``out1``, ... (the reference runtime: offline_compiler/execute.py)
OUTPUTS_FILE = "outputs.npz"
# The name a generated module gives the per-argument shapes it declares (codegen writes it,
# the worker reads it).
ARGUMENT_SHAPES = "ARGUMENT_SHAPES"
PR_SET_PDEATHSIG = 1  # <sys/prctl.h>

# PyPTO 0.2.0 orders some of its sets by object address, so a compile's program.json follows
# the lengths of the strings it allocates, among them the paths of its folders: every working
# folder is padded to one length (docs/determinism.md, "The heap a compile starts from").
WORKSPACE_CHARS = 400
COMPONENT_CHARS = 200  # the longest padding component (a file name has at most 255 bytes)
PAD = "_"


def workspace(folder, name: str):
    """``folder/name`` with underscores added (in components of at most ``COMPONENT_CHARS``)
    until its real path is ``WORKSPACE_CHARS`` long, whatever the cache folder, staging folder
    and job it is in: PyPTO takes the real path of every file it writes (``RealPath``) and of the
    config and log folders it reads, and their lengths are sizes of strings it allocates. A
    folder longer already (the cache folder would be ~300 characters long) keeps its length."""
    base = folder.resolve() / name
    components, tail = divmod(max(0, WORKSPACE_CHARS - len(str(base))), COMPONENT_CHARS + 1)
    return base.with_name(name + PAD * tail).joinpath(*[PAD * COMPONENT_CHARS] * components)


class FailureKind(enum.Enum):
    """Why a region ships unfused; the value is its category in the blob, ``--json`` and the
    report. The first three come from workers, the others from the build."""

    CANNOT_EXPRESS = "cannot express"
    COMPILE_FAILED = "compile failed"
    TIMED_OUT = "timed out"
    CRASHED = "worker crashed"
    NO_TILE_FITS = "no tile fits"
    CHECK_FAILED = "failed check"
    SLOWER_FUSED = "slower fused"


# How each kind's reason begins, for a person reading it (the words are free to change: the
# kind travels beside them).
HEADLINES = {
    FailureKind.CANNOT_EXPRESS: "cannot express",
    FailureKind.COMPILE_FAILED: "PyPTO compile failed",
    FailureKind.TIMED_OUT: "PyPTO compile did not finish within",
    FailureKind.CRASHED: "PyPTO worker crashed",
    FailureKind.NO_TILE_FITS: "no tile fits",
    FailureKind.CHECK_FAILED: "failed its functional check",
    FailureKind.SLOWER_FUSED: "slower fused",
}


@dataclass(frozen=True)
class Failure:
    """Why a job (or a region) has no result: its kind, the whole reason a person reads, and
    whether it is ``transient`` (a worker that died or ran out of time says nothing about the
    kernel: the next build tries again, nothing is cached)."""

    kind: FailureKind
    reason: str
    transient: bool = False

    @classmethod
    def of(cls, kind: FailureKind, detail: str, transient: bool = False) -> Failure:
        """The reason is the kind's headline followed by ``detail`` (which brings its own
        separator: " 300 s", ": <error>", " (exit code -9)")."""
        return cls(kind, f"{HEADLINES[kind]}{detail}", transient)

    def to_dict(self) -> dict:
        return {"error": self.reason, "transient": self.transient, "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: dict) -> Failure:
        return cls(FailureKind(data["kind"]), str(data["error"]), bool(data.get("transient")))


def timed_out(limit: float) -> Failure:
    return Failure.of(FailureKind.TIMED_OUT, f" {seconds_text(limit)}", transient=True)


def crashed(how: str) -> Failure:
    return Failure.of(FailureKind.CRASHED, f" ({how})", transient=True)


@dataclass(frozen=True)
class Candidate:
    """One tile candidate as the worker takes it: the tile policy's fields (``budget``,
    ``swapped``, ``flat``, ``merge``), the generated module's text under a name made of its
    content key (the worker runs it from memory and imports no file: docs/kernel-cache.md);
    for a single op of the measured baseline also its own kernel function, op key, inputs (by
    name in the job's inputs.npz) and outputs."""

    budget: int
    swapped: bool
    flat: bool
    merge: int
    module: str
    source: str
    function: str | None = None
    op: str | None = None
    inputs: tuple[str, ...] | None = None
    outputs: tuple[dict, ...] | None = None

    def to_dict(self) -> dict:
        data = {"budget": self.budget, "swapped": self.swapped, "flat": self.flat,
                "merge": self.merge, "module": self.module, "source": self.source}
        if self.op is not None:
            data.update(function=self.function, op=self.op, inputs=list(self.inputs),
                        outputs=[dict(o) for o in self.outputs])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(data["budget"], data["swapped"], data["flat"], data["merge"], data["module"],
                   data["source"], data.get("function"), data.get("op"),
                   None if data.get("inputs") is None else tuple(data["inputs"]),
                   None if data.get("outputs") is None else tuple(data["outputs"]))


@dataclass(frozen=True)
class Job:
    """What one worker child compiles: ``candidates`` of the kernel ``function`` with the job's
    ``outputs`` (shapes and torch dtypes), each checked by pass-verify and against the reference
    when ``verify``; ``parallel`` > 1 lets the child compile that many at once (None: the
    measured baseline's jobs, which never ask). The executor adds where the job runs:
    ``folder`` and the kernel cache whose g++ cache it shares (``host_compiler_cache``), whose
    team's group, when one was named, that g++ cache trusts too (``cache_group``, a gid:
    docs/kernel-cache.md, "The trust rule")."""

    function: str
    verify: bool
    candidates: tuple[Candidate, ...]
    outputs: tuple[dict, ...] = ()
    parallel: int | None = None
    folder: str | None = None
    host_compiler_cache: str | None = None
    cache_group: int | None = None
    # The reference is the original model's values, in another precision than the kernel's
    # (pypto_kernels/precision_check.py): PyPTO's own check is not given it (its tolerance,
    # 1e-3, would stop the run at the first difference), and an fp16 output is compared with
    # it as fp16 can tell them (``runtime.saturated_fp16``): those of its outputs that
    # ``saturated_outputs`` lists by index (the ones only kernels read). Else, with ``verify``,
    # PyPTO compares the kernel's outputs with the reference's too.
    original_reference: bool = False
    saturated_outputs: tuple[int, ...] = ()
    # A run, not a check: the job's one candidate runs on its inputs and its outputs are saved
    # (``OUTPUTS_FILE``), with no reference (the reference runtime executes a blob's kernel).
    save_outputs: bool = False

    def to_dict(self) -> dict:
        data = {"function": self.function, "verify": self.verify}
        if self.parallel is not None:
            data["parallel"] = self.parallel
        data.update(candidates=[c.to_dict() for c in self.candidates],
                    outputs=[dict(o) for o in self.outputs])
        if self.folder is not None:
            data.update(folder=self.folder, host_compiler_cache=self.host_compiler_cache)
        if self.cache_group is not None:  # only then: a job of one's own cache reads as before
            data["cache_group"] = self.cache_group
        if self.original_reference:
            data.update(original_reference=True, saturated_outputs=list(self.saturated_outputs))
        if self.save_outputs:  # only then: every other job's text (and cache key) is as before
            data["save_outputs"] = True
        return data

    def to_json(self) -> str:
        """``job.json``'s text (the key order the workers have always been given)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        return cls(data["function"], bool(data["verify"]),
                   tuple(Candidate.from_dict(c) for c in data["candidates"]),
                   tuple(data.get("outputs", ())), data.get("parallel"), data.get("folder"),
                   data.get("host_compiler_cache"), data.get("cache_group"),
                   bool(data.get("original_reference", False)),
                   tuple(int(i) for i in data.get("saturated_outputs", ())),
                   bool(data.get("save_outputs", False)))

    def rest(self, done: int) -> Job:
        """The job less its first ``done`` candidates (a child stops at its first failed
        compile; the others run in another)."""
        return replace(self, candidates=self.candidates[done:])


# What the worker reads from the simulator for every compiled candidate (worker.cost_of).
COST_FIGURES = ("aicore_us", "total_us", "tasks")


@dataclass(frozen=True)
class CandidateResult:
    """What PyPTO made of one candidate: its tile fields as given, and whether it compiled, its
    cost-model times, tasks, UB peak and GM traffic counted from its program, and for a checked
    compile the pass-verify verdicts, the largest difference to the reference and where its
    artifacts were kept. ``checked`` and ``artifact_files`` are the build's own notes (a
    checked round; a cache hit's artifacts, in memory)."""

    budget: int
    swapped: bool
    flat: bool = False
    merge: int = 0
    op: str | None = None
    function: str | None = None
    compiled: bool = False
    error: str | None = None
    seconds: float | None = None
    run_dir: str | None = None
    aicore_us: float | None = None
    total_us: float | None = None
    tasks: int | None = None
    ub_bytes: int | None = None
    gm_bytes: dict | None = None
    verdicts: tuple[dict, ...] | None = None
    max_abs_diff: float | None = None
    magnitude: float | None = None  # the reference's largest finite |value| (within_tolerance)
    # msaccucmp's metrics of the least similar float output against the reference
    # (runtime.precision_metrics); what the precision check reads (precision_check.py)
    metrics: dict | None = None
    artifacts: str | None = None
    checked: bool = False
    artifact_files: dict | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, data: dict) -> CandidateResult:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("verdicts") is not None:
            values["verdicts"] = tuple(values["verdicts"])
        return cls(**values)

    def to_dict(self) -> dict:
        """The fields the worker gives: those it left out are None here and left out again,
        but for the cost model's figures, which a compiled candidate always has (None when
        the simulator gave none)."""
        data = asdict(self)
        data.pop("artifact_files")
        data.pop("checked")
        if data["verdicts"] is not None:
            data["verdicts"] = list(data["verdicts"])
        return {k: v for k, v in data.items()
                if v is not None or (self.compiled and k in COST_FIGURES)}

    def relocated(self, old: str, new: str) -> CandidateResult:
        """The paths it names (run folder, kept artifacts) under ``new`` instead of ``old``: a
        job run on another machine's folder, its files copied here."""
        moved = {name: new + getattr(self, name)[len(old):] for name in ("run_dir", "artifacts")
                 if (getattr(self, name) or "").startswith(old)}
        return replace(self, **moved)


@dataclass(frozen=True)
class JobResult:
    """A job's answer: each candidate's result, in order (a child that stopped at a failed
    compile gives fewer than the job had), or the ``failure`` that left it without one."""

    candidates: tuple[CandidateResult, ...] = ()
    failure: Failure | None = None

    @property
    def transient(self) -> bool:
        return self.failure is not None and self.failure.transient

    def to_dict(self) -> dict:
        if self.failure is not None:
            return self.failure.to_dict()
        return {"candidates": [c.to_dict() for c in self.candidates]}

    @classmethod
    def from_dict(cls, data: dict) -> JobResult:
        if "kind" in data:
            return cls(failure=Failure.from_dict(data))
        return cls(tuple(CandidateResult.from_dict(c) for c in data.get("candidates", [])))

    @classmethod
    def failed(cls, failure: Failure) -> JobResult:
        return cls(failure=failure)

    def relocated(self, old: str, new: str) -> JobResult:
        return replace(self, candidates=tuple(c.relocated(old, new) for c in self.candidates))


def calculator_library(cache: Path, torch_version: str) -> Path:
    """PyPTO's calculator (pass-verify's interpreter, a host library built against torch) in
    ``cache``: a fork server builds it there once per machine and torch (``worker.
    load_calculator``, about 2 min on 2 cores), and a build looks for it to say so before its
    first job (``executor.FirstBuildNotice``)."""
    return cache / f"pypto0.2.0-torch{torch_version}" / "install" / "lib" / \
        "libtile_fwk_calculator.so"
