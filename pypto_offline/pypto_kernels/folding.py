"""Rank folding: PyPTO 0.2.0's code generation stops above rank 4 ("exceed dimension limit"), yet
exporters write 5-D and 6-D data movement (grouped-query attention's expand, Swin's window
partition). Adjacent axes that an op treats alike can be merged without changing the result:
- broadcasting (Expand, elementwise): a run of axes where every operand is either full or 1;
- Transpose: input axes that stay adjacent and in order in the output, and axes of size 1.
The generator reshapes to the folded shapes, runs the op there, and reshapes back."""
from __future__ import annotations

from math import prod
from typing import Sequence


def right_aligned(shape: Sequence[int], rank: int) -> list[int]:
    """``shape`` with unit axes in front, to ``rank`` axes (numpy's broadcasting alignment)."""
    return [1] * (rank - len(shape)) + list(shape)


def fold_broadcast(out_shape: Sequence[int], operand_shapes: Sequence[Sequence[int]]
                   ) -> tuple[list[int], list[list[int]]]:
    """Folded output shape and operand shapes (operands right-aligned to the output rank)."""
    rank = len(out_shape)
    operands = [right_aligned(s, rank) for s in operand_shapes]

    def kinds(axis):  # per operand: does it broadcast along this axis?
        return tuple(shape[axis] == 1 and out_shape[axis] != 1 for shape in operands)

    groups: list[list[int]] = []
    for axis in range(rank):
        if out_shape[axis] == 1:
            if groups:
                groups[-1].append(axis)  # size-1 axes fold into any neighbour
            else:
                groups.append([axis])
            continue
        if groups and _group_kind(groups[-1], out_shape, kinds) in (None, kinds(axis)):
            groups[-1].append(axis)
        else:
            groups.append([axis])
    folded_out = [prod(out_shape[a] for a in g) for g in groups]
    folded_operands = [[prod(shape[a] for a in g) for g in groups] for shape in operands]
    return folded_out, folded_operands


def _group_kind(group, out_shape, kinds):
    for axis in group:
        if out_shape[axis] != 1:
            return kinds(axis)
    return None


def fold_transpose(shape: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """Folded input shape and permutation: drops axes of size 1 (where they go changes no
    element's place; DepthToSpace's 6-D transpose of a batch of one) and merges input axes that
    stay adjacent in order."""
    kept = [axis for axis in range(len(shape)) if shape[axis] != 1]
    if len(kept) < len(shape) and kept:
        renumber = {axis: i for i, axis in enumerate(kept)}
        return fold_transpose([shape[a] for a in kept], [renumber[a] for a in perm if a in renumber])
    groups: list[list[int]] = []
    for axis in perm:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    by_start = sorted(groups, key=lambda g: g[0])
    folded_shape = [prod(shape[a] for a in g) for g in by_start]
    index = {tuple(g): i for i, g in enumerate(by_start)}
    return folded_shape, [index[tuple(g)] for g in groups]
