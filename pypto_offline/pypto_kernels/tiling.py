"""Tile shapes: which block of each op's output one task computes in the Unified Buffer.

A policy is a byte budget per operand tile. For an output shape it fills the tile from the
innermost axis outwards: the last axis rounded up to 32 bytes (PyPTO's data-movement tiles need
``lastDimBytes % 32 == 0``), then outer axes while the budget lasts. Axes an op needs whole (the
concat axis, both axes of a swap) are taken whole first. The budgets tried keep every leaf's operand
tiles inside the target's UB less a margin; the cost model charges per task, so the best budget is
found by compiling candidates (``search``).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

BLOCK_BYTES = 32
# Candidates keep four operand tiles (inputs, output, a temporary) inside UB. Tried: two (budgets up
# to UB/2): single-op kernels gained more than fused ones, and the bundled example's fused kernel
# fell behind its unfused ops (23.6 against 20.5 us). A wider search wants per-op budgets first.
MIN_OPERANDS_PER_LEAF = 4
CANDIDATE_BUDGETS = (4096, 8192, 16384, 32768, 65536)
DEFAULT_BUDGET = 8192


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


def candidate_policies(ub_plan_bytes: int) -> list[TilePolicy]:
    """The budgets that keep a leaf's operand tiles inside the target's UB."""
    return [TilePolicy(b) for b in CANDIDATE_BUDGETS if b * MIN_OPERANDS_PER_LEAF <= ub_plan_bytes]


def default_policy(ub_plan_bytes: int) -> TilePolicy:
    fitting = candidate_policies(ub_plan_bytes)
    return next((p for p in fitting if p.budget_bytes == DEFAULT_BUDGET), fitting[0])
