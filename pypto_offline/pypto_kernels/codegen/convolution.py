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

from typing import Callable, Mapping

from pypto_offline.fusion.records import RegionOp
from pypto_offline.importer.ops import is_depthwise_conv
from pypto_offline.pypto_kernels.codegen.matmul import pointwise_conv
from pypto_offline.pypto_kernels.codegen.writer import Writer, full, let


def _conv(w: Writer, op: RegionOp) -> None:
    """A depthwise convolution here, a 1x1 one as the cube's matmul."""
    if is_depthwise_conv(op.op_type, op.params):
        depthwise_conv(w, op)
    else:
        pointwise_conv(w, op)


def depthwise_conv(w: Writer, op: RegionOp) -> None:
    image, weights, out = op.inputs[0], op.inputs[1], op.outputs[0]
    p = op.params
    (kh, kw), (sh, sw), (dh, dw) = p["kernel_shape"], p["strides"], p["dilations"]
    _, channels, out_h, out_w = w.shape(out)
    dtype = w.dtype(out)
    padded = _padded(w, image, p["pads"], dtype)
    # the taps' sum at stride 1 over the rows and columns the strided outputs need
    span = [1, channels, (out_h - 1) * sh + 1, (out_w - 1) * sw + 1]
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
    for axis, stride in ((2, sh), (3, sw)):
        if stride > 1:
            span[axis] = (out_h, out_w)[axis - 2]
            w.tile(span, dtype)
            total = let(w, f"pypto.index_select({total}, {axis}, "
                           f"pypto.arange(0, {(span[axis] - 1) * stride + 1}, {stride}))")
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


LOWERINGS: Mapping[str, Callable[[Writer, RegionOp], None]] = {"Conv": _conv}
