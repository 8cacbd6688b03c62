"""Tile shapes: which block of each op's output one task computes in the Unified Buffer.

A policy is a byte budget per operand tile. For an output shape it fills the tile from the
innermost axis outwards: the last axis rounded up to 32 bytes (PyPTO's data-movement tiles need
``lastDimBytes % 32 == 0``), then outer axes while the budget lasts. Axes an op needs whole (the
concat axis, both axes of a swap) are taken whole first. The budgets tried keep every leaf's operand
tiles inside the target's UB less a margin; the cost model charges per task, so the best budget is
found by compiling candidates (``search``).

Both directions pay: a large tensor wants large tiles (fewer tasks, each a fixed cost), a small one
wants tiles small enough to give every AI core a task (measured on BERT's Add→Reshape→Transpose,
1x16x64 fp32: 7.46 us at the 8 KiB default in 5 tasks, 2.03 us at 2 KiB in 2). Candidates are the
budgets that give a region's largest tensor between one and ``MAX_TILES`` tiles (plus the default and
the larger ones), so the search stays a handful of compiles whatever the size.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

BLOCK_BYTES = 32
# Candidates keep four operand tiles (inputs, output, a temporary) inside UB. Tried: two (budgets up
# to UB/2): single-op kernels gained more than fused ones, and the bundled example's fused kernel
# fell behind its unfused ops (23.6 against 20.5 us). A wider search wants per-op budgets first.
MIN_OPERANDS_PER_LEAF = 4
CANDIDATE_BUDGETS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
DEFAULT_BUDGET = 8192
# Above this many tiles of the largest tensor a smaller budget only adds tasks (and compile time).
MAX_TILES = 256


@dataclass(frozen=True)
class TilePolicy:
    budget_bytes: int

    def tile(self, shape: tuple[int, ...], itemsize: int, whole_axes: tuple[int, ...] = ()
             ) -> tuple[int, ...]:
        if not shape:
            return (BLOCK_BYTES // itemsize,)
        rank = len(shape)
        align = max(BLOCK_BYTES // itemsize, 1)
        tile = [1] * rank
        last = rank - 1
        tile[last] = -(-shape[last] // align) * align
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


def fitting_budgets(ub_plan_bytes: int) -> list[int]:
    """The budgets that keep a leaf's operand tiles inside the target's UB."""
    return [b for b in CANDIDATE_BUDGETS if b * MIN_OPERANDS_PER_LEAF <= ub_plan_bytes]


def candidate_policies(ub_plan_bytes: int, largest_tensor_bytes: int) -> list[TilePolicy]:
    """Fitting budgets from the one that needs at most ``MAX_TILES`` tiles of the largest tensor
    up to the first that holds it whole. The default and every larger budget stay in (a tensor
    too large for ``MAX_TILES`` tiles still gains from fewer); the report compares against the
    default."""
    fitting = fitting_budgets(ub_plan_bytes)
    default = default_policy(ub_plan_bytes).budget_bytes
    chosen, whole = [], False
    for budget in fitting:
        if whole:
            break
        if budget * MAX_TILES >= largest_tensor_bytes or budget >= default:
            chosen.append(budget)
        whole = budget >= largest_tensor_bytes
    return [TilePolicy(b) for b in sorted(set(chosen) | {default})]


def default_policy(ub_plan_bytes: int) -> TilePolicy:
    fitting = fitting_budgets(ub_plan_bytes)
    return TilePolicy(DEFAULT_BUDGET if DEFAULT_BUDGET in fitting else fitting[0])
