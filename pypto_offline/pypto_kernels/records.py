"""What the kernel stage hands on: per region a compiled, checked kernel or a fallback."""
from __future__ import annotations

from dataclasses import dataclass, field

from pypto_offline.pypto_kernels.jobs.protocol import HEADLINES, FailureKind

# How the reasons of kernels stored before their kind was (cache entries and blobs of format
# 22 and earlier) begin: read for those records only (``legacy_fallback_kind``).
LEGACY_HEADLINES = tuple((headline, kind) for kind, headline in HEADLINES.items())


def legacy_fallback_kind(reason: str | None) -> FailureKind | None:
    """The kind of a fallback recorded before kinds were stored, by its reason's first words
    (None for a kernel that shipped, or a reason no kind begins)."""
    if not reason:
        return None
    return next((kind for headline, kind in LEGACY_HEADLINES if reason.startswith(headline)),
                None)


@dataclass(frozen=True)
class TileResult:
    budget_bytes: int
    aicore_us: float | None
    total_us: float | None
    tasks: int
    ub_bytes: int | None = None  # UB the compiled leaves allocate at peak
    swapped_transposes: bool = False  # transpose tiles in the other orientation (tiling.py)
    flat_rows: bool = False  # an elementwise region run on rows of its elements (tiling.py)
    vec_merge: int = 0  # PyPTO's leaf merging capped (tiling.TilePolicy.vec_merge; 0: its own)
    # why it did not compile, in PyPTO's words (a buffer of the platform it overflows, worker.py)
    error: str | None = None


@dataclass(frozen=True)
class Kernel:
    region_id: str
    compiled: bool
    fallback_reason: str | None = None
    source: str = ""
    cache_key: str = ""
    default_tile: TileResult | None = None
    tuned_tile: TileResult | None = None
    # every tile candidate the search compiled, in order; one that did not compile has no times
    candidates: tuple[TileResult, ...] = ()
    gm_bytes_read: int = 0
    gm_bytes_written: int = 0
    functional_ok: bool = False
    max_abs_diff: float | None = None
    verdicts: tuple[tuple[str, str], ...] = ()
    artifacts: dict = field(default_factory=dict, compare=False)  # name → bytes
    compile_seconds: float = 0.0
    from_cache: bool = False
    # PyPTO compiles this build ran for the kernel (tile candidates and the checked final): 0
    # when the kernel or each of its compiles came from the cache. Not stored in the cache.
    pypto_compiles: int = 0
    # why it fell back (None: it shipped), from where that happened: never read from the words
    # of ``fallback_reason``
    fallback_kind: FailureKind | None = None

    @property
    def reached_pypto(self) -> bool:
        """False when the kernel generator refused the region, so PyPTO compiled nothing for
        it; such a region falls back the same way on every build, cache or not."""
        return self.fallback_kind is not FailureKind.CANNOT_EXPRESS

    @property
    def gm_bytes(self) -> int:
        return self.gm_bytes_read + self.gm_bytes_written
