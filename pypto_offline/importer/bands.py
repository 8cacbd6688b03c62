"""Constants a kernel makes from bounds instead of reading them: bands of a matrix.

An attention's causal mask is a constant ``[.., R, C]`` (a decoder's export folds it: GPT-2's
and LLaMA's ``[1, 1, new, past + new]`` bool, True where key ``j <= i + past``) that every layer
would read from GM, R x C elements, where two bounds say all of it. A *band* is such a constant:
the same ``[R, C]`` matrix for every index of its leading axes (all of extent 1), holding
``inside`` where ``low <= j - i <= high`` and ``outside`` elsewhere. The kernel generator writes
it as a comparison of two index ranges (running sums of ones: codegen/bands.py) and the kernel
takes no argument for it; the cost model counts no bytes read for it, as for a one-element
constant (docs/regions.md, "Masks made in the kernel").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import onnx

# The element types a band is written in: its two values a Python literal of the type
BAND_DTYPES = (np.dtype(np.bool_), np.dtype(np.float32))


@dataclass(frozen=True)
class Band:
    """``inside`` where ``low <= column - row <= high`` in each ``[rows, columns]`` matrix,
    ``outside`` elsewhere; ``low``/``high`` None where no element lies beyond them."""
    rows: int
    columns: int
    low: int | None
    high: int | None
    inside: bool | float
    outside: bool | float


def band_of(value: np.ndarray) -> Band | None:
    """The band ``value`` is, or None: rank 2 or more, leading axes of extent 1, bool or fp32,
    two values, split by one or two diagonals (a uniform matrix is no band: it is not a mask)."""
    if value.ndim < 2 or value.dtype not in BAND_DTYPES or any(d != 1 for d in value.shape[:-2]):
        return None
    matrix = value.reshape(value.shape[-2:])
    rows, columns = matrix.shape
    # a band's first row and column hold its two values at most: a weight matrix is refused
    # there, before the offsets of all its elements are compared
    if rows * columns < 2 or np.unique(np.concatenate([matrix[0], matrix[:, 0]])).size > 2:
        return None
    offsets = np.arange(columns)[None, :] - np.arange(rows)[:, None]
    for corner in (matrix[0, 0], matrix[-1, -1]):  # the main diagonal lies inside a band
        inside = corner
        kept = matrix == inside
        kept_offsets = offsets[kept]
        low, high = int(kept_offsets.min()), int(kept_offsets.max())
        within = (offsets >= low) & (offsets <= high)
        others = matrix[~within]
        if np.array_equal(kept, within) and others.size and np.all(others == others.flat[0]):
            return Band(rows, columns, low if low > -(rows - 1) else None,
                        high if high < columns - 1 else None, _literal(inside),
                        _literal(others.flat[0]))
    return None


def bands_among(names: Iterable[str], constants: Mapping[str, np.ndarray]) -> dict[str, Band]:
    """Each of ``names`` that is a band constant, and its band."""
    found = {}
    for name in names:
        band = band_of(np.asarray(constants[name])) if name in constants else None
        if band is not None:
            found[name] = band
    return found


def _literal(value: np.generic) -> bool | float:
    return bool(value) if isinstance(value, np.bool_) else float(value)


def could_be_in_source(shape: tuple[int, ...], elem_type: int) -> bool:
    """Whether a constant of this shape and ONNX element type may be held in a kernel's source
    (``in_source``), before its value is looked at."""
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return True
    return len(shape) >= 2 and all(d == 1 for d in shape[:-2]) and elem_type in (
        onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT)


def in_source(value: np.ndarray) -> bool:
    """Whether a kernel holds the constant in its source, reading nothing: one element (a
    literal) or a band (written from bounds)."""
    return np.asarray(value).size == 1 or band_of(np.asarray(value)) is not None
