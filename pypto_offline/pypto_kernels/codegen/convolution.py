"""The depthwise convolution: each output channel a weighted sum of a small window of its own
input channel (``importer/contractions._conv``; a 1x1 convolution is a matmul, ``matmul.py``).

PyPTO 0.2.0 has no usable conv and no strided view (docs/pypto-ops.md, "Depthwise convolution").
The kernel writes the sum over the window's taps: the input padded once with zeros (``pad``
on the right and bottom, ``concat`` of zero strips on the top and left), then per tap a view of
the padded input shifted by the tap's offset, times the tap's weight per channel (a ``[1, C, 1,
Wo]`` row, broadcast over the output rows in place), added to the taps before it. A stride
takes every s-th row and column of the stride-1 sum with ``index_select``. The bias is one more
per-channel row. Everything after it (the activation, a squeeze-and-excite gate, a residual) is
the region's epilogue, written by the other lowerings."""
from __future__ import annotations

from math import prod
from typing import Callable, Mapping

from pypto_offline.fusion.records import RegionOp
from pypto_offline.importer.ops import is_depthwise_conv, stride_one_span
from pypto_offline.pypto_kernels.codegen.matmul import conv_product, pointwise_conv
from pypto_offline.pypto_kernels.codegen.movement import every_step
from pypto_offline.pypto_kernels.codegen.writer import Writer, full, let


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
    are. Each tap is the padded image's view at the tap's offset, strided, laid out as
    ``[Cin, 1, Ho*Wo]``; the taps are concatenated on that middle axis."""
    image, out = op.inputs[0], op.outputs[0]
    p = op.params
    (kh, kw), (dh, dw) = p["kernel_shape"], p["dilations"]
    _, _, out_h, out_w = w.shape(out)
    channels = w.shape(image)[1]
    dtype = w.dtype(image)  # the staged element: int8 for a ConvInteger (whose out is int32)
    padded = _padded(w, image, p["pads"], dtype)
    pixels = out_h * out_w
    taps = []
    for row in range(kh):
        for column in range(kw):
            tap = _strided_view(w, padded, [1, channels, out_h, out_w], (row * dh, column * dw),
                                p["strides"], dtype)
            w.tile([1, channels, out_h, out_w], dtype)
            tap = let(w, f"pypto.clone({tap})")  # a reshaped view moves element by element
            w.tile([channels, 1, pixels], dtype)
            taps.append(let(w, f"pypto.reshape({tap}, [{channels}, 1, {pixels}])"))
    w.tile([channels, kh * kw, pixels], dtype, whole_axes=(1,))
    stacked = let(w, f"pypto.concat([{', '.join(taps)}], 1)")
    w.tile([channels * kh * kw, pixels], dtype)
    return let(w, f"pypto.reshape({stacked}, [{channels * kh * kw}, {pixels}])")


def _strided_view(w: Writer, padded: str, shape, offsets, strides, dtype: int) -> str:
    """The padded image's window at ``offsets`` that a tap reads at every output pixel: a view
    of the rows and columns it spans, then every stride-th of them (``index_select``)."""
    span = stride_one_span(shape, strides)
    w.tile(span, dtype)
    value = let(w, f"pypto.view({padded}, {span}, [0, 0, {offsets[0]}, {offsets[1]}])")
    return _every_stride(w, value, shape, strides, dtype)


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


def depthwise_conv(w: Writer, op: RegionOp) -> None:
    image, weights, out = op.inputs[0], op.inputs[1], op.outputs[0]
    p = op.params
    (kh, kw), (sh, sw), (dh, dw) = p["kernel_shape"], p["strides"], p["dilations"]
    _, channels, _, out_w = w.shape(out)
    dtype = w.dtype(out)
    padded = _padded(w, image, p["pads"], dtype)
    # the taps' sum at stride 1 over the rows and columns the strided outputs need
    span = stride_one_span(w.shape(out), (sh, sw))
    w.tile(span, dtype)
    tile = w.current_tile
    total = None
    for row in range(kh):
        for column in range(kw):
            weight = _per_channel(w, weights, [channels, 1, 1, 1], [0, 0, row, column],
                                  span[3], dtype, tile)
            w.set_tile(tile)
            tap = let(w, f"pypto.view({padded}, {span}, [0, 0, {row * dh}, {column * dw}])")
            product = let(w, f"pypto.mul({tap}, {weight})")
            total = product if total is None else let(w, f"pypto.add({total}, {product})")
    total = _every_stride(w, total, w.shape(out), (sh, sw), dtype)
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
