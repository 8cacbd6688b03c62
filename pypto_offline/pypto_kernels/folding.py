"""Rank folding: PyPTO 0.2.0's code generation stops above rank 4 ("exceed dimension limit"), yet
exporters write 5-D and 6-D data movement (grouped-query attention's expand, Swin's window
partition). Adjacent axes that an op treats alike can be merged without changing the result:
- broadcasting (Expand, elementwise): a run of axes where every operand is either full or 1;
- Transpose: input axes that stay adjacent and in order in the output, and axes of size 1;
- Slice: an axis taken whole into the axis before it, an axis taken one index of into the one
  after it, and axes of size 1 (a transformer's qkv split, [1, N, 3, H, D] sliced on its 3).
The generator reshapes to the folded shapes, runs the op there, and reshapes back."""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Window:
    """A Slice on a row-major tensor: per axis the size, first index, elements spanned (from
    the first to one past the last taken) and step."""
    shape: tuple[int, ...]
    starts: tuple[int, ...]
    spans: tuple[int, ...]
    steps: tuple[int, ...]


def fold_slice(window: Window) -> Window:
    """The same elements taken from the tensor on fewer axes: axes of size 1 dropped, and an
    axis merged into the group before it when the group's index is fixed (spans one) or the
    axis is taken whole at step 1 with the group stepping by one (each taken index of the
    group is then one contiguous run of the merged axis)."""
    groups: list[list[int]] = []  # [size, start, span, step] per folded axis
    for size, start, span, step in zip(window.shape, window.starts, window.spans, window.steps):
        if size == 1 and len(window.shape) > 1:
            continue
        whole = start == 0 and span == size and step == 1
        if groups and (groups[-1][2] == 1 or whole and groups[-1][3] == 1):
            outer = groups[-1]
            fixed = outer[2] == 1
            groups[-1] = [outer[0] * size, outer[1] * size + start,
                          span if fixed else outer[2] * size, step if fixed else 1]
        else:
            groups.append([size, start, span, step])
    groups = groups or [[1, 0, 1, 1]]
    return Window(*(tuple(column) for column in zip(*groups)))
