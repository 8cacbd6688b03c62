"""What the kernel stage hands on: per region a compiled, checked kernel or a fallback."""
from __future__ import annotations

from dataclasses import dataclass, field

from pypto_offline.fusion.records import CANNOT_EXPRESS

# Why a region fell back, as the first words of its reason: the blob stores the reason, and its
# category (``--json``'s ``fallback_category``, the report's, the unfused ops') is read back
# from them (``fallback_category``).
COMPILE_FAILED = "PyPTO compile failed"
TIMED_OUT = "PyPTO compile did not finish within"
CRASHED = "PyPTO worker crashed"
NO_TILE_FITS = "no tile fits"
CHECK_FAILED = "failed its functional check"
SLOWER_FUSED = "slower fused"
FALLBACK_CATEGORIES = ((CANNOT_EXPRESS, CANNOT_EXPRESS), (COMPILE_FAILED, "compile failed"),
                       (TIMED_OUT, "timed out"), (CRASHED, "worker crashed"),
                       (NO_TILE_FITS, NO_TILE_FITS), (CHECK_FAILED, "failed check"),
                       (SLOWER_FUSED, SLOWER_FUSED))


def fallback_category(reason: str | None) -> str | None:
    """The category of a fallback reason (None for a kernel that shipped: no reason)."""
    if not reason:
        return None
    return next((category for prefix, category in FALLBACK_CATEGORIES
                 if reason.startswith(prefix)), "other")


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
    platform: str = ("Ascend910B (DAV_2201): the only platform PyPTO 0.2.0 ships; tiling "
                     "constrained by the target")
    artifacts: dict = field(default_factory=dict, compare=False)  # name → bytes
    compile_seconds: float = 0.0
    from_cache: bool = False
    # PyPTO compiles this build ran for the kernel (tile candidates and the checked final): 0
    # when the kernel or each of its compiles came from the cache. Not stored in the cache.
    pypto_compiles: int = 0

    @property
    def reached_pypto(self) -> bool:
        """False when the kernel generator refused the region, so PyPTO compiled nothing for
        it; such a region falls back the same way on every build, cache or not."""
        return not (self.fallback_reason or "").startswith(CANNOT_EXPRESS)

    @property
    def gm_bytes(self) -> int:
        return self.gm_bytes_read + self.gm_bytes_written
