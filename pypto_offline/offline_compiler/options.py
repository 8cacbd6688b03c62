"""A build's options, spelled once (issue 55). Each field of ``BuildOptions`` says which of
``api.compile``'s keywords give it (their defaults, and how their values become the field's),
the compile command's flag for each keyword (its spelling, help and parsing: ``cli.flags``),
and what the blob's provenance records of it. The API's keywords, the command line's build
flags and ``provenance()`` are derived from these (docs/architecture.md, "A build option")."""
from __future__ import annotations

import hashlib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Mapping, Sequence

import numpy as np

from pypto_offline.importer import precision
from pypto_offline.importer.input_format import parse_input_format
from pypto_offline.pypto_kernels.baseline import ESTIMATED, MEASURED
from pypto_offline.pypto_kernels.cache_trust import Trust
from pypto_offline.pypto_kernels.jobs.executor import Executor
from pypto_offline.pypto_kernels.versions import DEFAULT_TIMEOUT_S
from pypto_offline.resources import check_cache, check_limits

DEFAULT_JOBS = 2


@dataclass(frozen=True)
class Keyword:
    """One of ``api.compile``'s keywords, and the compile command's flag for it: none where the
    command line gives the value its own way (``--inputs`` a file, ``--dim`` gears) or not at
    all. The flag's value is the keyword's (its argparse dest is the keyword), and a flag left
    out (None) leaves the keyword to its default here."""

    name: str
    default: object = None
    flags: tuple[str, ...] = ()
    help: str = ""
    argparse: Mapping[str, object] = field(default_factory=dict)  # metavar, type, action


@dataclass(frozen=True)
class Option:
    """How a field of ``BuildOptions`` is given and recorded."""

    keywords: tuple[Keyword, ...]
    # every keyword's value (a namespace) → the field's, checking it (bad input: a UsageError
    # before any work); None: the field's one keyword's value as given
    take: Callable[[SimpleNamespace], object] | None = None
    # refuses bad input (a UsageError, before any work) of a field taken as given
    check: Callable[[SimpleNamespace], object] | None = None
    # the field's value → what the provenance records of it; None: nothing, as it does not
    # change the output (jobs, the cache folder, time limits)
    record: Callable[[object], dict[str, str]] | None = None
    # recorded only under a converting precision mode: a graph kept as it came says nothing
    converted_only: bool = False

    def value(self, given: SimpleNamespace):
        if self.check:
            self.check(given)
        return self.take(given) if self.take else getattr(given, self.keywords[0].name)


def option(default=MISSING, *, default_factory=MISSING, keywords: Sequence[Keyword],
           take=None, check=None, record=None, converted_only: bool = False):
    """A field of ``BuildOptions``. A keyword taken as given (checked or not) has the field's
    default; one converted has its own (None: not given)."""
    if take is None:
        (keyword,) = keywords
        keywords = (replace(keyword, default=default),)
    spec = Option(tuple(keywords), take, check, record, converted_only)
    return field(default=default, default_factory=default_factory, metadata={Option: spec})


def _when_given(key: str, text: Callable[[object], str]):
    """A record written only when the option is given: a blob built without it stays
    byte-identical to one built before the option existed."""
    return lambda value: {key: text(value)} if value else {}


def _pairs(mapping: Mapping, text: Callable[[object], str]) -> str:
    return ";".join(f"{name}={text(value)}" for name, value in sorted(mapping.items()))


def _digest(value: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]


def _checked_trust(given: SimpleNamespace) -> Trust:
    return check_cache(given.cache_dir, given.cache_trust_group)


def _check_limits(given: SimpleNamespace) -> None:
    check_limits(given.jobs, given.kernel_timeout)


def _input_format(given: SimpleNamespace) -> str | None:
    return parse_input_format(given.input_format) if given.input_format else None


def _half_io_record(half_io: precision.HalfIO) -> dict[str, str]:
    return {**({"input_fp16_nodes": ";".join(half_io.inputs)} if half_io.inputs else {}),
            **({"output_type": "FP16"} if half_io.outputs else {})}


CACHE_DIR_HELP = ("kernel cache folder (default: $PYPTO_OFFLINE_CACHE, else "
                  "~/.cache/pypto-offline/kernels)")
CACHE_GROUP_HELP = ("a team's shared kernel cache: also trust what this group wrote in it "
                    "(default: $PYPTO_OFFLINE_CACHE_GROUP, else only your own and root's; "
                    "docs/kernel-cache.md)")


# The fields the provenance records come first, in the order it has always written them.
@dataclass(frozen=True)
class BuildOptions:
    input_shapes: Mapping[str, Sequence[int]] = option(
        default_factory=dict, keywords=[Keyword("input_shapes", help=(
            "each input's shape by name; wins over dims for the inputs it names"))],
        take=lambda given: dict(given.input_shapes or {}),
        record=lambda shapes: {"input_shapes": _pairs(shapes, lambda v: ",".join(map(str, v)))})
    tile_search: bool = option(True, keywords=[Keyword(
        "tile_search", flags=("--no-tile-search",), help="compile the default tile only",
        argparse={"action": "store_false"})],
        record=lambda search: {"tile_search": str(search).lower()})
    # Compile every op of the shipped regions alone for the unfused baseline (cached per op),
    # instead of the shipped estimate: docs/baseline.md.
    measure_baseline: bool = option(False, keywords=[Keyword(
        "measure_baseline", flags=("--measure-baseline",), argparse={"action": "store_true"},
        help="compile every fused op alone with PyPTO for the unfused cost figure (cached per "
             "op), instead of estimating it")],
        record=lambda measured: {"baseline": MEASURED if measured else ESTIMATED})
    # ATC's --precision_mode and --keep_dtype (importer/precision.py, docs/precision.md)
    precision_mode: str = option(precision.MUST_KEEP, keywords=[Keyword(
        "precision_mode", flags=("--precision_mode", "--precision-mode"),
        argparse={"metavar": "MODE"},
        help="ATC's precision modes: force_fp16, allow_fp32_to_fp16, must_keep_origin_dtype "
             "(the graph's own types; the default) or allow_mix_precision (fp16, with "
             "reductions, norms, softmax, exp and log in fp32 inside their kernels); "
             "docs/precision.md")],
        check=lambda given: precision.check_mode(given.precision_mode),
        record=lambda mode: {"precision_mode": mode}, converted_only=True)
    keep_dtype: precision.KeepDtype = option(precision.KeepDtype(), keywords=[Keyword(
        "keep_dtype", flags=("--keep_dtype", "--keep-dtype"), argparse={"metavar": "FILE"},
        help="ATC's file of ops kept in their original precision: a node name per line, or "
             "OpType::NAME for every op of that type")],
        take=lambda given: precision.read_keep_dtype(given.keep_dtype) if given.keep_dtype
        else precision.KeepDtype(),
        record=lambda keep: {"keep_dtype": ";".join(keep.lines)} if keep.lines else {},
        converted_only=True)
    half_io: precision.HalfIO = option(precision.HalfIO(), keywords=[
        Keyword("input_fp16_nodes", flags=("--input_fp16_nodes", "--input-fp16-nodes"),
                argparse={"metavar": "NAMES"},
                help="ATC's: model inputs given in fp16, separated by ';' (a converting "
                     "--precision_mode; the others keep their declared types)"),
        Keyword("output_type", flags=("--output_type", "--output-type"),
                argparse={"metavar": "FP16|FP32"},
                help="ATC's: FP16 gives every float output in fp16 (a converting "
                     "--precision_mode); FP32, the default, keeps their types")],
        take=lambda given: precision.half_io(given.input_fp16_nodes, given.output_type),
        record=_half_io_record, converted_only=True)
    # Search each kernel's tiles again under PyPTO's 910B platform, which every target compiled
    # under before it had its own, and record that tile beside the shipped one (docs/platform.md).
    compare_platform: bool = option(False, keywords=[Keyword(
        "compare_platform", flags=("--compare-platform",), argparse={"action": "store_true"},
        help="also run each kernel's tile search under PyPTO's 910B platform, which every "
             "target compiled under before it had its own: the report and --json say how the "
             "tiles and PyPTO times changed (docs/platform.md)")],
        record=_when_given("compare_platform", lambda compared: "910b"))
    # ATC's --input_format (NCHW, NCDHW, ND): checked against the model's inputs, compiles the
    # same (importer/input_format.py)
    input_format: str | None = option(None, keywords=[Keyword(
        "input_format", flags=("--input_format", "--input-format"),
        argparse={"metavar": "NCHW|NCDHW|ND"},
        help="ATC's layout of the model's inputs: NCHW (a 4-D input), NCDHW (a 5-D one) or ND "
             "(any); checked against the model and recorded in the blob, compiles the same")],
        take=_input_format, record=_when_given("input_format", str))
    # Symbolic dimensions fixed by name (--dim batch=1); input_shapes wins for its inputs.
    dims: Mapping[str, int] = option(
        default_factory=dict, keywords=[Keyword("dims", help=(
            "symbolic dimensions fixed by name in every input that has them ({'batch': 1})"))],
        take=lambda given: dict(given.dims or {}),
        record=_when_given("dims", lambda dims: _pairs(dims, str)))
    # Real input values for the import's shape probe (see ``import_model``), and whether the
    # model will be verified, so that one onnxruntime cannot run is refused before compiling.
    # Recorded by digest: their values may fix shapes the model leaves to them.
    inputs: Mapping[str, np.ndarray] = option(
        default_factory=dict, keywords=[Keyword("inputs", help=(
            "real values of some inputs by name, checked against the model, used to find the "
            "shapes that depend on them and by the check"))],
        take=lambda given: dict(given.inputs or {}),
        record=_when_given("inputs", lambda inputs: _pairs(inputs, _digest)))
    cache_dir: Path | None = option(None, keywords=[Keyword(
        "cache_dir", flags=("--cache-dir",), help=CACHE_DIR_HELP)],
        take=lambda given: Path(given.cache_dir) if given.cache_dir else None)
    # Whose entries the cache trusts (None: $PYPTO_OFFLINE_CACHE_GROUP's, else the user's own;
    # docs/kernel-cache.md, "The trust rule").
    cache_trust: Trust | None = option(None, keywords=[Keyword(
        "cache_trust_group", flags=("--cache-trust-group",), help=CACHE_GROUP_HELP,
        argparse={"metavar": "GROUP"})], take=_checked_trust)
    jobs: int = option(DEFAULT_JOBS, keywords=[Keyword(
        "jobs", flags=("--jobs",), argparse={"type": int},
        help=f"parallel PyPTO compiles (default {DEFAULT_JOBS}; with --executor ray, the "
             f"cluster's CPUs)")], check=_check_limits)
    # per PyPTO worker; past it the region falls back
    kernel_timeout_s: float = option(DEFAULT_TIMEOUT_S, keywords=[Keyword(
        "kernel_timeout", flags=("--kernel-timeout",),
        argparse={"type": float, "metavar": "SECONDS"},
        help=f"time limit per PyPTO compile; past it the region stays unfused (default "
             f"{DEFAULT_TIMEOUT_S})")],
        take=lambda given: given.kernel_timeout or DEFAULT_TIMEOUT_S)
    verify: bool = option(False, keywords=[Keyword(
        "verify", flags=("--no-verify",), help="skip the onnxruntime check",
        argparse={"action": "store_false"})])
    # Where the PyPTO jobs run (``pypto_kernels/jobs``): None, this machine's fork servers.
    executor: Executor | None = option(None, keywords=[Keyword("executor", help=(
        "where the PyPTO jobs run (api.executor() gives one; by default this machine's fork "
        "servers)"))])

    @classmethod
    def from_keywords(cls, **given) -> BuildOptions:
        """``api.compile``'s option keywords as a build's options, each checked and converted
        as its field says; one left out has its default."""
        unknown = sorted(set(given) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"compile() got an unexpected keyword argument {unknown[0]!r}")
        values = SimpleNamespace(**{**{name: k.default for name, k in KEYWORDS.items()},
                                    **given})
        return cls(**{f.name: f.metadata[Option].value(values) for f in fields(cls)})

    def provenance(self) -> dict[str, str]:
        """The options that change the output (not jobs, cache folder or time limit)."""
        converts = precision.converts(self.precision_mode)
        recorded: dict[str, str] = {}
        for each in fields(self):
            spec = each.metadata[Option]
            if spec.record and (converts or not spec.converted_only):
                recorded.update(spec.record(getattr(self, each.name)))
        return recorded


# Every keyword of every field, by name, in the fields' order.
KEYWORDS: dict[str, Keyword] = {keyword.name: keyword for each in fields(BuildOptions)
                                for keyword in each.metadata[Option].keywords}
