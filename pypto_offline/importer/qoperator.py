"""QOperator models: ``QLinearConv`` and ``QLinearMatMul`` written as the QDQ pattern they
compute, so that ``importer/quantised.py`` makes them the integer contractions it makes of a QDQ
model's (docs/int8.md, "QOperator format").

    QLinearConv(x, sx, zx, w, sw, zw, sy, zy, B)
      = QuantizeLinear(Conv(DequantizeLinear(x, sx, zx), DequantizeLinear(w, sw, zw), B * sx * sw),
                       sy, zy)

and ``QLinearMatMul`` the same with a ``MatMul`` and no bias. Both are exact definitions (ONNX:
the int32 bias is quantised with scale ``sx * sw`` and zero point 0). onnxruntime computes the
requantisation of the int32 accumulator with one float multiplier ``sx * sw / sy``; the folded
integer product rounds ``(acc * S + C) / sy``: the same value up to float rounding, so an
element may land one int8 step away, which verification counts (``verify.int8_steps``).

Only the form the cube can take is rewritten: scales and zero points constants, the
activation's per tensor, the weights (a constant) per tensor or per output channel, a constant
bias. Anything else stays the boundary it was, with onnxruntime computing it. A per-channel
weight scale needs ``DequantizeLinear``'s ``axis`` (opset 13): an older model keeps such a node
as it is.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from pypto_offline.importer.graph_index import Constants
from pypto_offline.importer.names import names_in, unused_name
from pypto_offline.registry.ops import is_op

QOPERATORS = ("QLinearConv", "QLinearMatMul")
AXIS_OPSET = 13  # DequantizeLinear's axis


def has_qoperators(model: onnx.ModelProto) -> bool:
    return any(is_op(n, QOPERATORS) for n in model.graph.node)


def expand_qoperators(model: onnx.ModelProto, constants: Constants) -> int:
    """Write each QLinearConv / QLinearMatMul of ``model`` it can take as DQ -> Conv/MatMul -> Q,
    in place (on a copy the caller made); how many. ``constants`` indexes the model's graph."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes, expanded, taken = [], 0, names_in(graph)
    for node in graph.node:
        pattern = _pattern(node, constants, opset, graph, taken)
        nodes.extend(pattern or [node])
        expanded += pattern is not None
    del graph.node[:]
    graph.node.extend(nodes)
    return expanded


def _pattern(node: onnx.NodeProto, constants: Constants, opset: int, graph: onnx.GraphProto,
             taken: set[str]) -> list[onnx.NodeProto] | None:
    if not is_op(node, QOPERATORS):
        return None
    x, sx, zx, w, sw, zw, sy, zy = (list(node.input) + [""] * 8)[:8]
    per_tensor = [constants.get(name) for name in (sx, zx, sy, zy)]
    weight_scale = constants.get(sw)
    if any(v is None or v.size != 1 for v in per_tensor) or w not in constants \
            or weight_scale is None or zw not in constants:
        return None
    conv = is_op(node, "QLinearConv")
    filters = constants[w].shape[0 if conv else -1]
    if weight_scale.size not in (1, filters):
        return None
    # per output channel: DequantizeLinear's axis (opset 13), of a 4-D filter bank or a matrix
    if weight_scale.size > 1 and (opset < AXIS_OPSET or (not conv and constants[w].ndim != 2)):
        return None
    bias = node.input[8] if conv and len(node.input) > 8 and node.input[8] else ""
    if bias and bias not in constants:
        return None
    out = node.output[0]

    def fresh(suffix: str) -> str:
        return unused_name(f"{out}_{suffix}", taken)
    axis = [] if weight_scale.size == 1 else [helper.make_attribute("axis", 0 if conv else 1)]
    dq_x = helper.make_node("DequantizeLinear", [x, sx, zx], [fresh("x")], name=fresh("dq_x"))
    dq_w = helper.make_node("DequantizeLinear", [w, sw, zw], [fresh("w")], name=fresh("dq_w"))
    dq_w.attribute.extend(axis)
    inputs = [dq_x.output[0], dq_w.output[0]]
    if bias:
        inputs.append(_float_bias(graph, constants, bias, per_tensor[0], weight_scale,
                                  fresh("bias")))
    product = helper.make_node("Conv" if conv else "MatMul", inputs, [fresh("float")],
                               name=fresh("product"))
    if conv:
        product.attribute.extend(node.attribute)
    q = helper.make_node("QuantizeLinear", [product.output[0], sy, zy], [out],
                         name=node.name or fresh("q"))
    return [dq_x, dq_w, product, q]


def _float_bias(graph: onnx.GraphProto, constants: Constants, bias: str, x_scale: np.ndarray,
                w_scale: np.ndarray, name: str) -> str:
    """The int32 bias in float: ``B * sx * sw`` (its quantisation's scale, zero point 0)."""
    value = (constants[bias].astype(np.float64) * float(x_scale.reshape(-1)[0])
             * w_scale.astype(np.float64).reshape(-1)).astype(np.float32)
    graph.initializer.append(constants.record(value, name))
    return name
