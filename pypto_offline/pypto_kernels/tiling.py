"""Tile shapes: which block of each op's output one task computes in the Unified Buffer.

A policy is a byte budget per operand tile. For an output shape it fills the tile from the
innermost axis outwards: the last axis rounded up to 32 bytes (PyPTO's data-movement tiles need
``lastDimBytes % 32 == 0``), then outer axes while the budget lasts. Axes an op needs whole (the
concat axis) are taken whole first; a transpose has two orientations (``swap_transpose_tiles``); a purely
elementwise region may also run on rows of its elements (``flat_rows``). The cost
model charges per task, so the best budget is found by compiling candidates (``search``).

Both directions pay: a large tensor wants large tiles (fewer tasks, each a fixed cost), a small one
wants tiles small enough to give every AI core a task (measured on BERT's Add→Reshape→Transpose,
1x16x64 fp32: 7.46 us at the 8 KiB default in 5 tasks, 2.03 us at 2 KiB in 2). Candidates are the
budgets that give a region's largest tensor between one and ``MAX_TILES`` tiles (plus the default and
the larger ones), so the search stays a handful of compiles whatever the size.

How many tiles a leaf keeps in UB at once depends on how PyPTO groups the ops into leaf functions,
which only the compiled program shows. So candidates go up to what two operand tiles (one in, one
out) allow, and the compiler drops every candidate whose compiled leaves allocate more UB than the
target plans with (``fits_ub``). The default is planned for four operand tiles; it is measured
too, and shrinks when its leaves need more.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from pypto_offline.fusion.cost import (CUBE_FRACTAL, L0_BYTES, L0C_BYTES, operand_rereads,
                                       product_tiles)
from pypto_offline.importer.contractions import INT8_CUBE_DEPTH

BLOCK_BYTES = 32
# The fewest operand tiles a leaf can hold (one in, one out): bounds the largest candidate. Whether
# a candidate really fits is measured on its compiled program (``fits_ub``).
CANDIDATE_OPERANDS = 2
# The default plans for inputs, output and a temporary (measured all the same: a leaf may hold more).
DEFAULT_OPERANDS = 4
CANDIDATE_BUDGETS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
DEFAULT_BUDGET = 8192
# A tile that cuts rows takes this many of them: on ppocrv4_det's squeeze-and-excite tail (a
# [96, 1] gate, under a (96, 8) tile, times [96, 6400] channel rows, two adds), (8, 1024) tiles
# ran in 24.0 us with 98,560 B of UB, (1, 1024) ones in 47.7 us with 184,416 B (over
# kirin9050's plan). PyPTO's UB peak varies with the pair of tiles in no simple way ((8, 512):
# 164,096 B; (16, 512): 98,816 B): the tile search's budgets try several.
SPLIT_TILE_ROWS = 8
# The leaf merge caps the search tries, in one round, when no candidate fits UB under PyPTO's
# own merging (``TilePolicy.vec_merge``; search._merge_capped).
MERGE_CAPS = (8, 4, 2, 1)
# Above this many tiles of the largest tensor a smaller budget only adds tasks (and compile time).
# 1024 keeps 4 KiB for a 2-4 MiB tensor: the best tile of the 1x64x128x128 fp16 Slice->Pad->Tile.
MAX_TILES = 1024


@dataclass(frozen=True)
class TilePolicy:
    budget_bytes: int
    # The other transpose-tile orientation: a transpose under the tile its input was made under,
    # and every op reading its result under that tile swapped (``codegen.movement._transpose_input_tile``,
    # ``Writer.follow``), where PyPTO keeps the data in UB; the default tiles the output as any
    # op's. On [64, 400] fp32, mul and relu then the transpose: 102,400 B read in 3.4 us against
    # 167,936; ppocrv4_rec's SiLU then transpose of 1x120x80: 17.8 us against 8.6 with the
    # default, so the search compiles both (docs/pypto-ops.md, "Transposes").
    swap_transpose_tiles: bool = False
    # Run a purely elementwise region on its elements laid out as rows of ``FLAT_ROW_BYTES``
    # (axes fused, then split: TVM's fuse + split) instead of its own shape, whose last axis pads
    # to 32 bytes in every tile: nudenet's 1x64x20x20 SiLU pads each 20-float row to 24.
    flat_rows: bool = False
    # At most this many identical vector subgraphs in one leaf (PyPTO's ``vec_nbuffer_setting``;
    # 0: its own merging). PyPTO merges the tiles of a large elementwise region into leaves
    # that hold each merged tile's buffers at once: ppocrv4_det's squeeze-and-excite tail
    # ([96, 1] gate times [96, 25600] rows, two adds) needed 188,672 B of UB under (8, 256)
    # tiles whatever the budget, over kirin9050's plan; capped at 4 (``MERGE_CAPS``) it needs
    # 106,752 B and runs in 89.8 us (57.0 unmerged-capped, 266 at 1: more tasks).
    vec_merge: int = 0

    @property
    def name(self) -> str:
        return (f"{self.budget_bytes}{'-swapped' if self.swap_transpose_tiles else ''}"
                f"{'-flat' if self.flat_rows else ''}"
                f"{f'-merge{self.vec_merge}' if self.vec_merge else ''}")

    def tile(self, shape: tuple[int, ...], itemsize: int, whole_axes: tuple[int, ...] = (),
             split_last: bool = False, row_itemsize: int | None = None) -> tuple[int, ...]:
        """A tile of about ``budget_bytes``: the last axis whole (unless ``split_last`` and it
        alone is larger than the budget: a row of channel rows, ``fusion/rows.channel_rows``),
        then as many of the axes before it as fit, innermost first. Its rows are whole 32-byte
        blocks of ``row_itemsize``-byte elements (default: ``itemsize``): a kernel holding an
        8-bit tensor aligns every tile so, and casts to int8 under the tile it computes in."""
        if not shape:
            return (BLOCK_BYTES // itemsize,)
        rank = len(shape)
        align = max(BLOCK_BYTES // min(itemsize, row_itemsize or itemsize), 1)
        tile = [1] * rank
        last = rank - 1
        tile[last] = -(-shape[last] // align) * align
        if split_last and last not in whole_axes:  # a block of rows, each cut the same
            columns = self.budget_bytes // itemsize // SPLIT_TILE_ROWS // align * align
            tile[last] = min(tile[last], max(align, columns))
        budget = max(self.budget_bytes // itemsize, tile[last])
        for axis in whole_axes:
            if axis != last:
                tile[axis] = shape[axis]
        for axis in range(rank - 2, -1, -1):
            if axis in whole_axes:
                continue
            room = budget // max(prod(tile), 1)
            tile[axis] = max(1, min(shape[axis], room))
        return tuple(tile)


# Cube (matmul) tiles, per PyPTO's set_cube_tile_shapes constraints for the 910B it compiles
# for: every side a multiple of 16 elements (32 bytes in fp16; fp32 asks 16 elements too), and
# an L0A/L0B tile (side x K side x itemsize) within 64 KiB. 128-element M and N sides with a
# 128-element (fp16) or 64-element (fp32) K side fit every buffer; [256, 256] K/N tiles overflow
# L0B. L1 and L0 take the same tile. The UB a matmul's kernel needs grows with its K side
# (whisper's 3000x201x80: 273 KiB at K 64, 143 KiB at K 32), so the K side follows the tile
# candidate's budget and the search finds one that fits (docs/pypto-ops.md, "MatMul").
CUBE_ALIGN = CUBE_FRACTAL
CUBE_SIDE = 128
CUBE_K_BYTES = 256
# The product tile, accumulated in fp32 in L0C: up to 128 KiB, any sides of whole 16-element
# fractals (128 x 256, 256 x 128, 32 x 512, 16 x 1024, 192 x 160 and 96 x 336 compiled and
# checked, docs/pypto-ops.md "MatMul"). A side also sets an L0A or L0B tile with the 16-element
# K side at the least. The vector epilogue takes the product in tiles as large, so the product
# tile follows the candidate's budget (``PRODUCT_BYTES_PER_BUDGET``): magika's 2048x257x128
# matmul with its epilogue needed 192 KiB of UB at 256 x 128 whatever the vector tile.
PRODUCT_BYTES_PER_BUDGET = 8
MIN_PRODUCT_BYTES = 16 * 1024
BIAS_TABLE_COLUMNS = 256


def cube_tiles(m: int, k: int, n: int, itemsize: int, budget_bytes: int, bias: bool = False
               ) -> tuple[list[int], list[int], list[int]]:
    """The ``set_cube_tile_shapes`` arguments (M, K, N; each [L0, L1]) for an m x k x n matmul
    under a tile candidate of ``budget_bytes``. The cube reads the left operand once per N tile
    and the right one once per M tile, so of the (M, N) sides within the budget's product bytes
    (``fusion/cost.product_tiles``) the one that re-reads the fewest bytes is taken, the fuller on a tie. A
    1x1 convolution's weight was read once per 128 pixels: 13 times on nudenet's 64x64x1600; a
    128x256x400 matmul read 934 KB in 16.5 us with 128 x 128, 672 KB in 16.2 us with 128 x 256;
    ppocrv4_det's 192x192x1600 fp32 read 4.38 MB at 192 x 128 and 3.93 MB (the least any tile
    within L0C reads, ``fusion/cost.cube_reread_bytes``) at 192 x 160 in the same 32.0 us
    (docs/pypto-ops.md "MatMul"). The K side is budget / (128 x itemsize) elements, 16 at the least and 256 bytes
    at the most, and within L0A and L0B. With a ``bias`` the N side holds in the cube's bias
    table (``BIAS_TABLE_COLUMNS``)."""
    def side(extent: int, cap: int, align: int = CUBE_ALIGN) -> int:
        return max(align, min(-(-extent // align) * align, cap))
    # an int8 fractal is 16 x 32: its K side is 32 deep (docs/int8.md)
    k_align = INT8_CUBE_DEPTH if itemsize == 1 else CUBE_ALIGN
    itemsize = max(itemsize, 2)

    def rereads(sides: tuple[int, int]) -> tuple[int, int]:
        m_side, n_side = side(m, sides[0]), side(n, sides[1])
        return operand_rereads(m, k, n, m_side, n_side, itemsize, itemsize), -m_side * n_side
    product_bytes = min(max(budget_bytes * PRODUCT_BYTES_PER_BUDGET, MIN_PRODUCT_BYTES),
                        L0C_BYTES)
    n_cap = BIAS_TABLE_COLUMNS if bias else None
    fitting = product_tiles(product_bytes, itemsize, n_cap, m) \
        or product_tiles(product_bytes, itemsize, n_cap)  # no side divides m: whisper's 3000
    m_cap, n_cap = min(fitting, key=rereads)
    m_tile, n_tile = side(m, m_cap), side(n, n_cap)
    k_cap = min(CUBE_K_BYTES // itemsize, budget_bytes // (CUBE_SIDE * itemsize),
                L0_BYTES // (max(m_tile, n_tile) * itemsize))
    k_tile = side(k, max(k_align, k_cap // k_align * k_align), k_align)
    return [m_tile, m_tile], [k_tile, k_tile], [n_tile, n_tile]


def fitting_budgets(ub_plan_bytes: int, operands: int = CANDIDATE_OPERANDS) -> list[int]:
    """The budgets whose ``operands`` tiles fit inside the target's planned UB."""
    return [b for b in CANDIDATE_BUDGETS if b * operands <= ub_plan_bytes]


def fits_ub(ub_bytes: int | None, ub_plan_bytes: int) -> bool:
    """Whether a compiled candidate's leaves stay within the target's planned UB (a candidate
    whose program could not be read is not trusted to)."""
    return ub_bytes is not None and ub_bytes <= ub_plan_bytes


def candidate_policies(ub_plan_bytes: int, largest_tensor_bytes: int) -> list[TilePolicy]:
    """Fitting budgets from the one that needs at most ``MAX_TILES`` tiles of the largest tensor
    up to the first that holds it whole. The default and every larger budget stay in (a tensor
    too large for ``MAX_TILES`` tiles still gains from fewer); the report compares against the
    default. Each budget comes in both transpose-tile orientations; the default and larger ones
    also in the flat-row layout, which pays through fewer, fuller tasks (on nudenet's SiLU
    kernels its best tile was 8 or 16 KiB, ahead of every own-shape tile). A region without a
    transpose, or not purely elementwise, gives the same source for some of them, which the
    compiler compiles once."""
    fitting = fitting_budgets(ub_plan_bytes)
    default = default_policy(ub_plan_bytes).budget_bytes
    chosen, whole = [], False
    for budget in fitting:
        if whole:
            break
        if budget * MAX_TILES >= largest_tensor_bytes or budget >= default:
            chosen.append(budget)
        whole = budget >= largest_tensor_bytes
    budgets = sorted(set(chosen) | {default})
    return [TilePolicy(b, swap, flat) for b in budgets for swap in (False, True)
            for flat in ((False, True) if b >= default else (False,))]


def default_policy(ub_plan_bytes: int) -> TilePolicy:
    fitting = fitting_budgets(ub_plan_bytes, DEFAULT_OPERANDS)
    return TilePolicy(DEFAULT_BUDGET if DEFAULT_BUDGET in fitting else fitting[0])


# How many of a region's budgets the tile search compiles first, largest first. Ranked by the
# tasks each budget makes of the largest tensor (the cost model charges per task, the bytes are
# the same whatever the tile), the best tile of 165 compiled corpus kernels (kirin9050, full
# search) was among the 3 largest budgets for 153 (93 %) and the 4 largest for 164; the small
# budgets left out are the slowest to compile (the example's 512 B tile: 74 s of a 160 s search).
# docs/compile-time.md.
SEARCHED_BUDGETS = 3
# What decides which candidates compile, in the kernel's cache key: a change of it recompiles.
SEARCH_RULES = (f"{SEARCHED_BUDGETS} largest budgets + default; flat rows deferred on UB; "
                "swapped transposes at the best own budget; "
                f"leaf merges capped at {MERGE_CAPS} when no candidate fits")


def search_rounds(policies: list[TilePolicy], default: TilePolicy
                  ) -> tuple[list[TilePolicy], list[TilePolicy]]:
    """The policies the search compiles first (the ``SEARCHED_BUDGETS`` largest budgets, and the
    default, which the report compares against), and the rest, compiled only when none of the
    first round fits the target's UB."""
    largest = sorted({p.budget_bytes for p in policies}, reverse=True)[:SEARCHED_BUDGETS]
    first = [p for p in policies if p.budget_bytes in largest or p.budget_bytes == default.budget_bytes]
    return first, [p for p in policies if p not in first]


def defer_flat_rows(first: list[TilePolicy]) -> tuple[list[TilePolicy], list[TilePolicy]]:
    """A first round's policies to compile now, and its flat-row ones to compile only as
    ``next_flat_rows`` allows: the flat layout at the largest budget goes first, the smaller
    budgets (largest first) wait on what it needed in UB."""
    flat = sorted((p for p in first if p.flat_rows), key=lambda p: -p.budget_bytes)
    return [p for p in first if p not in flat[1:]], flat[1:]


def next_flat_rows(compiled: list[tuple[int, int | None, float | None]],
                   deferred: list[TilePolicy], ub_plan_bytes: int) -> list[TilePolicy]:
    """The deferred flat-row policy to compile next (or none), given the flat candidates
    compiled so far, largest budget first, as (budget, UB bytes, AICore µs; None when it did
    not compile), as ``next_swapped`` takes them. A descent, one budget at a
    time: on while the tiles fit UB and the last smaller tile was faster; while none fits, on
    until a smaller tile needs no less UB than the larger one (PyPTO then lays the rows out
    whatever the tile: ppocrv4_det's HardSwish regions needed 196,608 B at 32, 16 and 8 KiB,
    and the 8 KiB compile alone took 18-50 s, whereas nudenet's flat SiLU regions shrank with
    the tile, 131,072 → 65,536 → 32,768 B, and fit at 16 KiB). Replayed on the full-search
    compiles of the corpus, the descent skips 42 of its flat compiles and loses one region's
    best tile (by 4.4 %); on ppocrv4_det 28 compiles, none a best tile. docs/compile-time.md."""
    if not deferred or not compiled:
        return []
    fitting = [us for _, ub, us in compiled if fits_ub(ub, ub_plan_bytes) and us is not None]
    last_ub = compiled[-1][1]
    if fits_ub(last_ub, ub_plan_bytes):
        improving = len(fitting) < 2 or fitting[-1] < fitting[-2]
        return deferred[:1] if improving else []
    before = compiled[-2][1] if len(compiled) > 1 else None
    if fitting or (last_ub is not None and before is not None and last_ub >= before):
        return []
    return deferred[:1]


def defer_swapped(first: list[TilePolicy]) -> tuple[list[TilePolicy], list[TilePolicy]]:
    """A first round's policies to compile now, and its swapped-transpose ones, which wait on
    the own orientation's results (``next_swapped``)."""
    return ([p for p in first if not p.swap_transpose_tiles],
            [p for p in first if p.swap_transpose_tiles])


def next_swapped(own: list[tuple[int, int | None, float | None]], deferred: list[TilePolicy],
                 ub_plan_bytes: int) -> list[TilePolicy]:
    """The deferred swapped-transpose policies to compile, given the own orientation's compiled
    candidates as (budget, UB bytes, AICore µs): only at the budget of the fastest own tile
    that fits, or all of them when none fits. The swapped orientation changes how a transpose
    walks its input, not how many tasks a budget makes: on the corpus's full-search compiles
    (26 regions with a transpose, and the bundled example, whose best tile is swapped) the best
    swapped tile was always at the best own tile's budget; 43 compiles of 26 regions skipped,
    no best tile lost. docs/compile-time.md."""
    fitting = [(us, budget) for budget, ub, us in own
               if fits_ub(ub, ub_plan_bytes) and us is not None]
    if not fitting:
        return list(deferred)
    best_budget = min(fitting)[1]
    return [p for p in deferred if p.budget_bytes == best_budget]
