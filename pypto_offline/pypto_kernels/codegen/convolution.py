"""The depthwise convolution: each output channel a weighted sum of a small window of its own
input channel (``importer/contractions._conv``; a 1x1 convolution is a matmul, ``matmul.py``).

PyPTO 0.2.0 has no usable conv and no strided view (docs/pypto-ops.md, "Depthwise convolution").
The kernel writes the sum over the window's taps: the input padded once with zeros (``pad``
on the right and bottom, ``concat`` of zero strips on the top and left), then per tap a view of
the padded input shifted by the tap's offset, times the tap's weight per channel (a ``[1, C, 1,
Wo]`` row, broadcast over the output rows in place), added to the taps before it. A stride
splits the padded image into its phases once, each tap a view of one (``_StridePhases``). The
bias is one more per-channel row. Everything after it (the activation, a squeeze-and-excite
gate, a residual) is the region's epilogue, written by the other lowerings."""
from __future__ import annotations

from math import prod
from typing import Callable, Mapping

from pypto_offline.fusion.cost import reads_stride_phases
from pypto_offline.fusion.records import RegionOp
from pypto_offline.registry.ops import is_depthwise_conv, stride_one_span
from pypto_offline.pypto_kernels.codegen.matmul import conv_product, pointwise_conv
from pypto_offline.pypto_kernels.codegen.movement import every_step
from pypto_offline.pypto_kernels.codegen.writer import Writer, full, itemsize_of, let


def _conv(w: Writer, op: RegionOp) -> None:
    """A depthwise convolution as its taps, a 1x1 one as the cube's matmul of the image, any
    other as the cube's matmul of its taps' columns."""
    if is_depthwise_conv(op.op_type, op.params):
        depthwise_conv(w, op)
    elif op.params:
        conv_product(w, op, lambda: _block_diagonal(w, op), lambda: _tap_columns(w, op),
                     _depth(w, op))
    else:
        pointwise_conv(w, op)


def _depth(w: Writer, op: RegionOp) -> int:
    """The contraction's depth: every input channel at every tap of the window."""
    _, _, kh, kw = w.shape(op.inputs[1])
    return w.shape(op.inputs[0])[1] * kh * kw


def _block_diagonal(w: Writer, op: RegionOp) -> str:
    """The weights ``[Cout, Cin/groups, kh, kw]`` as ``[Cout, Cin·kh·kw]``: as they are for one
    group; for several, each group's filters beside zeros for the other groups' channels, so
    one matmul of every tap's columns computes every group (``groups`` times the work)."""
    weights, groups = op.inputs[1], op.params["group"]
    filters, per_group = w.shape(weights)[0], prod(w.shape(weights)[1:])
    dtype = w.dtype(weights)
    if groups == 1:
        return w.value(weights, [filters, per_group])
    flat, rows = w.value(weights, [filters, per_group]), filters // groups
    blocks = []
    for group in range(groups):
        w.tile([rows, per_group], dtype)
        block = let(w, f"pypto.view({flat}, [{rows}, {per_group}], [{group * rows}, 0])")
        before, after = group * per_group, (groups - 1 - group) * per_group
        parts = ([full(w, [rows, before], 0.0, dtype)] if before else []) + [block] + \
            ([full(w, [rows, after], 0.0, dtype)] if after else [])
        w.tile([rows, groups * per_group], dtype, whole_axes=(1,))
        blocks.append(let(w, f"pypto.concat([{', '.join(parts)}], 1)"))
    w.tile([filters, groups * per_group], dtype, whole_axes=(0,))
    return let(w, f"pypto.concat([{', '.join(blocks)}], 0)")


def _tap_columns(w: Writer, op: RegionOp) -> str:
    """The image's columns as the cube multiplies them (implicit GEMM, written out): row
    ``c * kh * kw + tap`` holds input channel ``c`` as tap ``tap`` reads it at each output pixel,
    the order of the weights' ``[Cout, Cin, kh, kw]``, so they are the left operand as they
    are. Each tap is a view of the padded image (of its stride phases, ``_StridePhases``, or
    of its stride-1 span, strided), laid out as ``[Cin, 1, Ho*Wo]``; the taps are
    concatenated on that middle axis."""
    image, out = op.inputs[0], op.outputs[0]
    p = op.params
    (kh, kw), (dh, dw) = p["kernel_shape"], p["dilations"]
    _, _, out_h, out_w = w.shape(out)
    channels = w.shape(image)[1]
    dtype = w.dtype(image)  # the staged element: int8 for a ConvInteger (whose out is int32)
    shape = [1, channels, out_h, out_w]
    phased = reads_stride_phases(p, channels, shape, itemsize_of(dtype))
    phases = _StridePhases(w, image, p["pads"], p["strides"] if phased else (1, 1), dtype)
    pixels = out_h * out_w
    taps = []
    for row in range(kh):
        for column in range(kw):
            offsets = (row * dh, column * dw)
            if phased:
                tap = phases.tap(shape, offsets)
            else:
                tap = phases.tap(stride_one_span(shape, p["strides"]), offsets)
                tap = _every_stride(w, tap, shape, p["strides"], dtype)
            w.tile(shape, dtype)
            tap = let(w, f"pypto.clone({tap})")  # a reshaped view moves element by element
            w.tile([channels, 1, pixels], dtype)
            taps.append(let(w, f"pypto.reshape({tap}, [{channels}, 1, {pixels}])"))
    w.tile([channels, kh * kw, pixels], dtype, whole_axes=(1,))
    stacked = let(w, f"pypto.concat([{', '.join(taps)}], 1)")
    w.tile([channels * kh * kw, pixels], dtype)
    return let(w, f"pypto.reshape({stacked}, [{channels * kh * kw}, {pixels}])")


def _every_stride(w: Writer, value: str, shape, strides, dtype: int) -> str:
    """Every stride-th row and column of ``value`` (held in the stride-1 span of ``shape``), by
    ``index_select``; an axis of one element needs none (a one-index index_select failed
    PyPTO's check)."""
    span = stride_one_span(shape, strides)
    for axis, stride in ((2, strides[0]), (3, strides[1])):
        if stride > 1 and shape[axis] > 1:
            length, span[axis] = span[axis], shape[axis]
            w.tile(span, dtype)
            value = let(w, every_step(value, axis, length, stride))
    return value


class _StridePhases:
    """The padded image split by the window's stride ``s``: phase ``(r, c)`` holds its rows
    ``r, r + s, ...`` and columns ``c, c + s, ...``, so the tap at offset ``(oy, ox)`` reads,
    at every output pixel, phase ``(oy % s, ox % s)`` viewed at ``(oy // s, ox // s)`` with unit
    steps (PyPTO 0.2.0 has no strided view). Rows: the image reshaped to ``[.., Hp/s, s*Wp]``
    and viewed at column ``r * Wp``; columns: every s-th by ``index_select``, once per phase.
    Each tap then reads its output's extent, where a view of the stride-1 span strided per tap
    read s² times that and gathered it per tap: a 3x3 stride-2 convolution 16->32 on 32x32
    moved 1.85 MB in 194.7 us, this way 1.06 MB in 156.7 (docs/pypto-ops.md). At stride 1 the
    only phase is the padded image itself."""

    def __init__(self, w: Writer, image: str, pads, strides, dtype: int):
        top, left, bottom, right = pads
        n, channels, height, width = w.shape(image)
        sh, sw = strides
        # zeros below and to the right so that every phase has as many rows (columns)
        bottom += -(height + top + bottom) % sh
        right += -(width + left + right) % sw
        self.w, self.dtype, self.strides = w, dtype, (sh, sw)
        self.shape = [n, channels, height + top + bottom, width + left + right]
        self.padded = _padded(w, image, (top, left, bottom, right), dtype)
        self._phases: dict[tuple[int, int], str] = {}
        self._rows: dict[int, str] = {}
        self._reshaped: str | None = None

    def tap(self, shape, offsets, tile: tuple[int, ...] | None = None) -> str:
        """The view of ``shape`` the tap at ``offsets`` (in the padded image) reads, under
        ``tile`` (default: the shape's own)."""
        (sh, sw), (oy, ox) = self.strides, offsets
        phase = self._phase(oy % sh, ox % sw)
        if tile is None:
            self.w.tile(shape, self.dtype)
        else:
            self.w.set_tile(tile)
        return let(self.w, f"pypto.view({phase}, {list(shape)}, [0, 0, {oy // sh}, {ox // sw}])")

    def _phase(self, row: int, column: int) -> str:
        if (row, column) not in self._phases:
            self._phases[row, column] = self._columns_of(self._rows_of(row), column)
        return self._phases[row, column]

    def _rows_of(self, row: int) -> str:
        """Every s-th row of the padded image from ``row``: a view of the image reshaped so
        that each s consecutive rows are one."""
        sh = self.strides[0]
        if sh == 1:
            return self.padded
        n, channels, height, width = self.shape
        if self._reshaped is None:
            self.w.tile([n, channels, height // sh, sh * width], self.dtype)
            self._reshaped = let(self.w, f"pypto.reshape({self.padded}, "
                                         f"[{n}, {channels}, {height // sh}, {sh * width}])")
        if row not in self._rows:
            rows = [n, channels, height // sh, width]
            self.w.tile(rows, self.dtype)
            self._rows[row] = let(self.w, f"pypto.view({self._reshaped}, {rows}, "
                                          f"[0, 0, 0, {row * width}])")
        return self._rows[row]

    def _columns_of(self, rows: str, column: int) -> str:
        """Every s-th column of ``rows`` from ``column``: ``index_select`` of the view from
        there, or the one column's view when one is taken (a one-index index_select failed
        PyPTO's check)."""
        sw = self.strides[1]
        if sw == 1:
            return rows
        n, channels, height, width = self.shape
        height //= self.strides[0]
        taken = width // sw
        span = width - column if taken > 1 else 1
        if column or taken == 1:
            self.w.tile([n, channels, height, span], self.dtype)
            rows = let(self.w, f"pypto.view({rows}, {[n, channels, height, span]}, "
                               f"[0, 0, 0, {column}])")
        if taken == 1:
            return rows
        self.w.tile([n, channels, height, taken], self.dtype)
        return let(self.w, every_step(rows, 3, span, sw))


def depthwise_conv(w: Writer, op: RegionOp) -> None:
    image, weights, out = op.inputs[0], op.inputs[1], op.outputs[0]
    p = op.params
    (kh, kw), strides, (dh, dw) = p["kernel_shape"], p["strides"], p["dilations"]
    _, channels, _, out_w = w.shape(out)
    dtype = w.dtype(out)
    phased = reads_stride_phases(p, channels, w.shape(out), itemsize_of(dtype))
    phases = _StridePhases(w, image, p["pads"], strides if phased else (1, 1), dtype)
    # the taps' sum over the output, or at stride 1 over the rows and columns it spans
    span = list(w.shape(out)) if phased else stride_one_span(w.shape(out), strides)
    w.tile(span, dtype)
    tile = w.current_tile
    total = None
    for row in range(kh):
        for column in range(kw):
            weight = _per_channel(w, weights, [channels, 1, 1, 1], [0, 0, row, column],
                                  span[3], dtype, tile)
            tap = phases.tap(span, (row * dh, column * dw), tile)
            product = let(w, f"pypto.mul({tap}, {weight})")
            total = product if total is None else let(w, f"pypto.add({total}, {product})")
    if not phased:
        total = _every_stride(w, total, w.shape(out), strides, dtype)
    span = list(w.shape(out))
    if len(op.inputs) > 2 and op.inputs[2]:
        w.tile(span, dtype)
        tile = w.current_tile
        bias = _per_channel(w, op.inputs[2], [channels], [0], out_w, dtype, tile)
        w.set_tile(tile)
        total = let(w, f"pypto.add({total}, {bias})")
    w.hold(out, total, span)


def _padded(w: Writer, image: str, pads, dtype: int) -> str:
    """The image with ``pads`` (top, left, bottom, right) of zeros: ``pypto.pad`` takes the
    right and bottom, zero strips concatenated take the top and left."""
    top, left, bottom, right = pads
    current = w.var(image)
    n, channels, height, width = w.shape(image)
    if bottom or right:
        height, width = height + bottom, width + right
        w.tile([n, channels, height, width], dtype)
        current = let(w, f'pypto.pad({current}, [0, {right}, 0, {bottom}], "constant", 0.0)')
    if left:
        strip = full(w, [n, channels, height, left], 0.0, dtype)
        width += left
        w.tile([n, channels, height, width], dtype, whole_axes=(3,))
        current = let(w, f"pypto.concat([{strip}, {current}], 3)")
    if top:
        strip = full(w, [n, channels, top, width], 0.0, dtype)
        height += top
        w.tile([n, channels, height, width], dtype, whole_axes=(2,))
        current = let(w, f"pypto.concat([{strip}, {current}], 2)")
    return current


def _per_channel(w: Writer, tensor: str, window, offsets, width: int, dtype: int,
                 tile: tuple[int, ...]) -> str:
    """One value per channel of ``tensor`` (the view ``window`` at ``offsets``) as a ``[1, C, 1,
    width]`` row, which a binary op under ``tile`` broadcasts over the rows in place (one
    axis)."""
    channels = window[0]
    w.tile(window, dtype)
    value = let(w, f"pypto.view({w.var(tensor)}, {list(window)}, {list(offsets)})")
    w.tile(window, dtype)
    value = let(w, f"pypto.clone({value})")  # a reshaped view moves element by element
    w.tile([1, channels, 1, 1], dtype)
    value = let(w, f"pypto.reshape({value}, [1, {channels}, 1, 1])")
    w.set_tile((1, tile[1], 1, tile[3]))  # the channels of the tile it is multiplied under
    return let(w, f"pypto.expand_clone({value}, [1, {channels}, 1, {width}])")


LOWERINGS: Mapping[str, Callable[[Writer, RegionOp], None]] = {"Conv": _conv, "ConvInteger": _conv}
