"""View algebra: data-movement ops as index maps over their input.

A ``View`` says where each element of an output comes from in a contiguous input: per axis a
size and a stride, one offset, and a mask of the positions that hold real data (the rest is the
pad value). Slice, Pad, Transpose, Expand and Reshape transform a view (the op's ``view``
in the registry names its transform in ``TRANSFORMS``); a chain of them composes
into one view, or a short stack of views where a Reshape cannot be merged (tinygrad's
ShapeTracker is the model). Two chains with equal stacks move the same elements to the same
places: this is how a chain is proven to be a no-op.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import numpy as np

from pypto_offline.registry.ops import op_def


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step if size != 1 else 0)
        step *= size
    return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    mask: tuple[tuple[int, int], ...] | None = None  # per axis [lo, hi) of real data
    pad_value: float = 0.0

    @staticmethod
    def of(shape: Sequence[int]) -> "View":
        return View(tuple(shape), contiguous_strides(shape))

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and \
            self.strides == contiguous_strides(self.shape)

    def _full_mask(self) -> tuple[tuple[int, int], ...]:
        return self.mask or tuple((0, n) for n in self.shape)

    def slice(self, starts, ends, steps) -> "View | None":
        sizes = tuple(len(range(s, e, st)) for s, e, st in zip(starts, ends, steps))
        if self.mask is not None and any(st != 1 for st in steps):
            return None  # a strided window over padding is not one view
        offset = self.offset + sum(s * stride for s, stride in zip(starts, self.strides)
                                   if s and stride)
        strides = tuple(stride * st for stride, st in zip(self.strides, steps))
        mask = None
        if self.mask is not None:
            mask = tuple((min(max(lo - s, 0), n), min(max(hi - s, 0), n))
                         for (lo, hi), s, n in zip(self.mask, starts, sizes))
        return View(sizes, tuple(0 if n == 1 else st for st, n in zip(strides, sizes)),
                    offset, _simplify_mask(mask, sizes), self.pad_value)

    def pad(self, pads: Sequence[int], value: float = 0.0) -> "View | None":
        rank = len(self.shape)
        begins, ends = pads[:rank], pads[rank:]
        if any(p < 0 for p in pads):  # negative pads crop: a slice, then the positive part
            cropped = self.slice([-min(b, 0) for b in begins],
                                 [n + min(e, 0) for n, e in zip(self.shape, ends)], [1] * rank)
            return None if cropped is None else cropped.pad([max(p, 0) for p in pads], value)
        if self.mask is not None and value != self.pad_value:
            return None
        shape = tuple(n + b + e for n, b, e in zip(self.shape, begins, ends))
        offset = self.offset - sum(b * stride for b, stride in zip(begins, self.strides))
        mask = tuple((lo + b, hi + b) for (lo, hi), b in zip(self._full_mask(), begins))
        return View(shape, self.strides, offset, _simplify_mask(mask, shape), value)

    def permute(self, perm: Sequence[int]) -> "View":
        mask = None if self.mask is None else tuple(self.mask[p] for p in perm)
        return View(tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm),
                    self.offset, mask, self.pad_value)

    def expand(self, shape: Sequence[int]) -> "View":
        shape = tuple(shape)
        strides = tuple(0 if old == 1 and new != 1 else st
                        for old, new, st in zip(self.shape, shape, self.strides))
        # a broadcast axis repeats its one position: real data everywhere, or padding everywhere
        mask = None if self.mask is None else tuple(
            ((0, new) if m[0] < m[1] else (0, 0)) if old == 1 and new != 1 else m
            for old, new, m in zip(self.shape, shape, self.mask))
        return View(shape, strides, self.offset, mask, self.pad_value)

    def reshape(self, shape: Sequence[int]) -> "View | None":
        """The same elements under a new shape, or None when no single view can say it."""
        shape = tuple(shape)
        if prod(shape) != prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        if self.is_contiguous or prod(shape) == 0:
            return View.of(shape)
        if self.mask is not None:
            return None
        return _reshape_strided(self, shape)


def _simplify_mask(mask, shape):
    if mask is None or all(lo == 0 and hi == n for (lo, hi), n in zip(mask, shape)):
        return None
    return mask


def _reshape_strided(view: View, shape: tuple[int, ...]) -> View | None:
    """Merge and split axes where strides allow (size-1 axes ignored)."""
    old = [(n, st) for n, st in zip(view.shape, view.strides) if n != 1]
    strides: list[int] = []
    i = 0
    for size in shape:
        if size == 1:
            strides.append(0)
            continue
        # take old axes until their product reaches `size`; they must be mergeable
        if i >= len(old):
            return None
        n, st = old[i]
        if n % size == 0:  # split an old axis
            strides.append(st * (n // size))
            old[i] = (n // size, st)
            if old[i][0] == 1:
                i += 1
            continue
        total, inner_stride = n, st
        i += 1
        while total < size and i < len(old):
            n2, st2 = old[i]
            if inner_stride != st2 * n2:
                return None
            total, inner_stride = total * n2, st2
            i += 1
        if total != size:
            return None
        strides.append(inner_stride)
    return View(shape, tuple(strides), view.offset)


@dataclass(frozen=True)
class ViewStack:
    """Views applied innermost first: views[0] reads the input, views[-1] gives the output."""

    input_shape: tuple[int, ...]
    views: tuple[View, ...]

    @staticmethod
    def of(shape: Sequence[int]) -> "ViewStack":
        return ViewStack(tuple(shape), (View.of(shape),))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.views[-1].shape

    @property
    def is_identity(self) -> bool:
        return len(self.views) == 1 and self.views[0].is_contiguous and \
            self.views[0].shape == self.input_shape

    def _top(self, new: View | None, fallback) -> "ViewStack | None":
        if new is not None:
            return ViewStack(self.input_shape, self.views[:-1] + (new,))
        stacked = fallback(View.of(self.shape))
        return None if stacked is None else ViewStack(self.input_shape, self.views + (stacked,))

    def apply(self, op_type: str, params) -> "ViewStack | None":
        """The stack after one more op, or None if the op is not a view op (the registry names
        no transform for it) or the algebra cannot say this one (a Pad other than constant)."""
        definition = op_def(op_type)
        transform = TRANSFORMS.get(definition.view) if definition is not None else None
        return None if transform is None else transform(self, params)

    def gather(self, x: np.ndarray) -> np.ndarray:
        """Materialise the output from ``x`` (for tests and proofs, not for kernels)."""
        flat = x.reshape(-1)
        values = flat
        for view in self.views:
            values = _gather_view(view, values)
        return values.reshape(self.shape)


def _slice(stack: ViewStack, p) -> ViewStack | None:
    window = (p["starts"], p["ends"], p["steps"])
    return stack._top(stack.views[-1].slice(*window), lambda v: v.slice(*window))


def _pad(stack: ViewStack, p) -> ViewStack | None:
    if p["mode"] != "constant":
        return None  # an edge or reflect pad repeats data: no mask says it
    value = float(p["value"] or 0)
    return stack._top(stack.views[-1].pad(p["pads"], value), lambda v: v.pad(p["pads"], value))


def _permute(stack: ViewStack, p) -> ViewStack | None:
    return stack._top(stack.views[-1].permute(p["perm"]), None)


def _expand(stack: ViewStack, p) -> ViewStack | None:
    return stack._top(stack.views[-1].expand(p["shape"]), None)


def _reshape(stack: ViewStack, p) -> ViewStack | None:
    return stack._top(stack.views[-1].reshape(p["shape"]), lambda v: v.reshape(p["shape"]))


def _identity(stack: ViewStack, p) -> ViewStack:
    return stack


# The transforms an op's ``OpDef.view`` names (registry/ops.py): the stack after the op, given
# its canonical parameters.
TRANSFORMS: Mapping[str, Callable[[ViewStack, Mapping], "ViewStack | None"]] = MappingProxyType({
    "slice": _slice, "pad": _pad, "permute": _permute, "expand": _expand, "reshape": _reshape,
    "identity": _identity,
})


def _gather_view(view: View, flat: np.ndarray) -> np.ndarray:
    index = np.full(view.shape, view.offset, dtype=np.int64)
    valid = np.ones(view.shape, dtype=bool)
    for axis, (size, stride) in enumerate(zip(view.shape, view.strides)):
        shape = [1] * len(view.shape)
        shape[axis] = size
        positions = np.arange(size).reshape(shape)
        index = index + positions * stride
        if view.mask is not None:
            lo, hi = view.mask[axis]
            valid = valid & (positions >= lo) & (positions < hi)
    out = np.full(view.shape, view.pad_value, dtype=flat.dtype)
    out[valid] = flat[index[valid]]
    return out.reshape(-1)
