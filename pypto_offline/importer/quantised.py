"""QDQ models: quantised contractions folded into integer ones (docs/int8.md).

onnxruntime's ``quantize_static`` (QDQ format) writes a quantised MatMul, Gemm or Conv as float
ops between ``DequantizeLinear`` nodes: ``MatMul(DQ(xq, sx, zx), DQ(wq, sw, 0))``. Compiled as it
stands, each DQ and Q is a kernel of its own and the product runs in float on float weights. This
pass writes each such contraction as the integer product the cube computes on int8 operands and
its dequantisation as the epilogue, in standard ONNX (so onnxruntime runs whatever is left out)::

    acc = MatMulInteger(xq, wq)        # or ConvInteger(xq, wq, <the Conv's attributes>): int32
    y   = Mul(Cast(acc, FLOAT), S)     # S = sx * sw: a scalar, one per column or per filter
    y   = Add(y, C)                    # C = bias - zx * S * (the sum of each filter's weights)

``(xq - zx) @ wq = xq @ wq - zx * colsum(wq)``, so the activation's zero point is a constant of
the epilogue, exact wherever every tap reads the image (a MatMul, a Gemm, an unpadded Conv). The
last op keeps the contraction's output name. A contraction this cannot write (uint8 or
per-channel activations, weights with zero points, a padded convolution of an activation whose
zero point is not 0, a depthwise one) stays float, its reason in ``Quantised.left_float``, and
the activation's DequantizeLinear then runs inside its kernel.

A QOperator model's QLinearConv and QLinearMatMul are first written as their QDQ pattern
(``importer/qoperator.py``), and uint8 activations as int8 ones shifted by 128
(``importer/uint8_activations.py``); then taken as any other.

Runs after the first fold, whose folder leaves DequantizeLinear alone (``keeps_quantised``) so the
int8 weights survive it; the DQ of a constant this pass does not take is folded to float here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pypto_offline.importer.node_context import NodeContext, NotCanonical, normaliser
from pypto_offline.importer.contractions import too_shallow_for_int8
from pypto_offline.importer.graph_index import Constants, names_in_subgraphs, readers_of
from pypto_offline.importer.int8_movers import move_quantised, quantise_concat_parts
from pypto_offline.importer.names import names_in, unused_name
from pypto_offline.importer.qoperator import expand_qoperators, has_qoperators
from pypto_offline.importer.uint8_activations import as_int8_activations
from pypto_offline.registry.ops import is_op

QUANTISED_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
DEQUANTIZE = "DequantizeLinear"


def keeps_quantised(node) -> bool:
    """The folder must not evaluate a DequantizeLinear: its int8 input is what this pass
    multiplies on the cube (``folding.fold``'s ``should_fold``)."""
    return is_op(node, DEQUANTIZE)


@dataclass(frozen=True)
class Dequantised:
    """A DequantizeLinear's operand: the quantised tensor, its scale(s), zero point(s) and axis."""

    quantised: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    dtype: int


@dataclass
class Quantised:
    """What the pass did: the contractions it made integer, and those left float with why."""

    integer: list[str] = field(default_factory=list)
    left_float: dict[str, str] = field(default_factory=dict)
    # QLinearConv / QLinearMatMul written as their QDQ pattern first (``importer/qoperator``)
    qoperators: int = 0
    # uint8 activations made int8, shifted by 128 (``importer/uint8_activations``)
    uint8_shifted: int = 0
    # data movement on the int8 tensor, its Q/DQ pair dropped (``importer/int8_movers``)
    moved_int8: int = 0
    # concats of quantised parts, each part quantised (``importer/int8_movers``)
    concats_int8: int = 0

    def summary(self) -> dict:
        """The import summary's ``quantised`` entry; empty for a model that is not QDQ."""
        counts = {"qoperators": self.qoperators, "uint8_shifted": self.uint8_shifted,
                  "moved_int8": self.moved_int8, "concats_int8": self.concats_int8}
        if not self.integer and not self.left_float and not any(counts.values()):
            return {}
        return {"integer": list(self.integer), "left_float": dict(self.left_float),
                **{key: count for key, count in counts.items() if count}}


class _Graph:
    """Producers, consumers and constants of one graph, for the rewrite."""

    def __init__(self, model: onnx.ModelProto, constants: Constants):
        self.model = model
        self.graph = model.graph
        self.constants = constants
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.new_nodes: dict[int, list[onnx.NodeProto]] = {}
        self.new_constants: list[onnx.TensorProto] = []

    def value(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def dequantised(self, name: str) -> Dequantised | None:
        """The DQ producing ``name``, when its scale and zero point are constants."""
        node = self.producer.get(name)
        if node is None or not is_op(node, DEQUANTIZE):
            return None
        scale = self.value(node.input[1])
        zero = self.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        if scale is None or (zero is None and len(node.input) > 2 and node.input[2]) or block:
            return None
        dtype = self._dtype(node.input[0], zero)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return Dequantised(node.input[0], scale.astype(np.float64),
                           np.zeros_like(scale, np.int64) if zero is None
                           else zero.astype(np.int64), axis, dtype)

    def _dtype(self, name: str, zero: np.ndarray | None) -> int:
        if name in self.constants:
            return self.constants.data_type(name)
        if zero is not None:
            return helper.np_dtype_to_tensor_dtype(zero.dtype)
        return onnx.TensorProto.UINT8  # the default zero point's type

    def constant(self, name: str, value: np.ndarray) -> str:
        name = self._fresh(name)
        self.new_constants.append(self.constants.record(value, name))
        return name

    def _fresh(self, name: str) -> str:
        candidate = unused_name(name, set(self.constants) | set(self.producer))
        self.producer[candidate] = None  # reserved
        return candidate


def fold_quantised(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Quantised]:
    """A copy of ``model`` with its quantised contractions integer and every other DQ of a
    constant folded to float; a model without DequantizeLinear comes back unchanged."""
    if not has_qoperators(model) and not any(is_op(n, DEQUANTIZE) for n in model.graph.node):
        return model, Quantised()
    model = onnx.ModelProto.FromString(model.SerializeToString())
    constants = Constants(model.graph)
    qoperators = expand_qoperators(model, constants)
    done = Quantised(qoperators=qoperators, uint8_shifted=as_int8_activations(model, constants),
                     moved_int8=move_quantised(model, constants),
                     concats_int8=quantise_concat_parts(model, constants))
    g = _Graph(model, constants)
    for index, node in enumerate(list(g.graph.node)):
        if is_op(node, frozenset(_CONTRACTIONS)):
            why = _CONTRACTIONS[node.op_type](g, index, node)
            if why is None:
                done.integer.append(node.output[0])
            elif why:
                done.left_float[node.output[0]] = why
    _rebuild(g)
    _fold_constant_dequantisations(g)
    _drop_unused(g.graph)
    _one_dequantisation_per_reader(g.graph)
    return model, done


def _activation_and_weights(g: _Graph, node: onnx.NodeProto
                            ) -> tuple[Dequantised | None, Dequantised | None, str]:
    """The dequantised activation and constant weights of a contraction, or why not; '' when
    the node is not quantised at all (nothing to say)."""
    x, w = g.dequantised(node.input[0]), g.dequantised(node.input[1])
    if x is None or w is None or w.quantised not in g.constants:
        return None, None, ""
    if x.quantised in g.constants:
        return None, None, ""
    if x.dtype != onnx.TensorProto.INT8 or w.dtype != onnx.TensorProto.INT8:
        return None, None, ("uint8 operands: PyPTO 0.2.0's cube multiplies int8 by int8 "
                            "(quantise with QuantType.QInt8)")
    if x.scale.size != 1 or x.zero_point.size != 1:
        return None, None, "a per-channel activation: the kernel's operand is scaled per tensor"
    if np.any(w.zero_point != 0):
        return None, None, ("asymmetric weights: PyPTO 0.2.0's int8 matmul has no weight zero "
                            "point")
    return x, w, ""


def _per_filter(scale: np.ndarray, count: int) -> np.ndarray:
    return np.broadcast_to(scale.reshape(-1), (count,)) if scale.size == 1 else scale.reshape(-1)


def _matmul(g: _Graph, index: int, node: onnx.NodeProto) -> str | None:
    x, w, why = _activation_and_weights(g, node)
    if x is None:
        return why
    weights = g.value(w.quantised)
    if weights.ndim != 2 or w.scale.size not in (1, weights.shape[1]) \
            or (w.scale.size > 1 and w.axis not in (1, -1)):
        return "weights that are not one matrix scaled per tensor or per column"
    if too_shallow_for_int8(weights.shape[0]):
        return too_shallow_for_int8(weights.shape[0])
    scale = float(x.scale.reshape(-1)[0]) * _per_filter(w.scale, weights.shape[1])
    shift = -float(x.zero_point.reshape(-1)[0]) * scale * weights.astype(np.int64).sum(axis=0)
    _integer_product(g, index, node, "MatMulInteger", [x.quantised, w.quantised], {},
                     scale, shift, filter_axis=-1)
    return None


def _gemm(g: _Graph, index: int, node: onnx.NodeProto) -> str | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0):
        return "a Gemm with transA"
    x, w, why = _activation_and_weights(g, node)
    if x is None:
        return why
    weights = g.value(w.quantised)
    if weights.ndim != 2:
        return "weights that are not one matrix"
    if attrs.get("transB", 0):  # MatMulInteger has no transpose: the int8 weights as [K, N]
        weights = np.ascontiguousarray(weights.T)
        right = g.constant(f"{w.quantised}_transposed", weights)
    else:
        right = w.quantised
    columns = weights.shape[1]
    if too_shallow_for_int8(weights.shape[0]):
        return too_shallow_for_int8(weights.shape[0])
    if w.scale.size not in (1, columns):
        return "weights scaled neither per tensor nor per output column"
    scale = (float(attrs.get("alpha", 1.0)) * float(x.scale.reshape(-1)[0])
             * _per_filter(w.scale, columns))
    shift = -float(x.zero_point.reshape(-1)[0]) * scale * weights.astype(np.int64).sum(axis=0)
    if len(node.input) > 2 and node.input[2]:
        bias = _constant_float(g, node.input[2])
        if bias is None or bias.size not in (1, columns):
            return "a Gemm whose C is not a constant per column"
        shift = shift + float(attrs.get("beta", 1.0)) * np.broadcast_to(bias.reshape(-1),
                                                                          (columns,))
    _integer_product(g, index, node, "MatMulInteger", [x.quantised, right], {},
                     scale, shift, filter_axis=-1)
    return None


def _conv(g: _Graph, index: int, node: onnx.NodeProto) -> str | None:
    x, w, why = _activation_and_weights(g, node)
    if x is None:
        return why
    weights = g.value(w.quantised)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    filters = weights.shape[0]
    if weights.ndim != 4:
        return "a convolution that is not 2-D"
    if attrs.get("group", 1) != 1:
        return ("a grouped or depthwise convolution: computed in float on its dequantised "
                "input, inside its kernel")
    if too_shallow_for_int8(weights.size // filters):
        return too_shallow_for_int8(weights.size // filters)
    if w.scale.size not in (1, filters) or (w.scale.size > 1 and w.axis != 0):
        return "weights scaled neither per tensor nor per filter"
    zero = int(x.zero_point.reshape(-1)[0])
    scale = float(x.scale.reshape(-1)[0]) * _per_filter(w.scale, filters)
    shift = -zero * scale * weights.astype(np.int64).reshape(filters, -1).sum(axis=1)
    if len(node.input) > 2 and node.input[2]:
        bias = _constant_float(g, node.input[2])
        if bias is None:
            return "a convolution whose bias is not a constant"
        shift = shift + np.broadcast_to(bias.reshape(-1), (filters,))
    image, prologue = x.quantised, []
    if zero and _padded(attrs):
        image, prologue = _quantised_with_padding(g, x, attrs)
        if image is None:
            return (f"a padded convolution of an activation with zero point {zero} that no "
                    "QuantizeLinear in the graph makes with explicit pads: the border's taps "
                    "would read the padding, not the zero point")
        attrs = {k: v for k, v in attrs.items() if k != "pads"}
    _integer_product(g, index, node, "ConvInteger", [image, w.quantised], attrs,
                     scale, shift, filter_axis=1, prologue=prologue)
    return None


def _padded(attrs: dict) -> bool:
    return any(attrs.get("pads", [])) or _auto_pad(attrs) != "NOTSET"


def _auto_pad(attrs: dict) -> str:
    value = attrs.get("auto_pad", "NOTSET")
    value = value.decode() if isinstance(value, bytes) else value
    return "NOTSET" if value == "VALID" else value


def _quantised_with_padding(g: _Graph, x: Dequantised, attrs: dict
                            ) -> tuple[str | None, list[onnx.NodeProto]]:
    """The int8 image padded with its zero point, for a ConvInteger without pads: the float
    image before its QuantizeLinear padded with zeros, then quantised again (Q(0) is the zero
    point), so the border's taps contribute ``zx * w``, which the shift's ``-zx * colsum(w)``
    takes out as it does everywhere else: exact. Pad and Q are the kernel's prologue
    (fusion/partition.py), returned with it; None when no Q with the DQ's scale and zero
    point makes the image, or the padding is an ``auto_pad`` one."""
    quantise = g.producer.get(x.quantised)
    if quantise is None or not is_op(quantise, "QuantizeLinear") or _auto_pad(attrs) != "NOTSET":
        return None, []
    scale = g.value(quantise.input[1])
    zero = g.value(quantise.input[2]) if len(quantise.input) > 2 and quantise.input[2] else None
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 \
            or float(scale.reshape(-1)[0]) != float(x.scale.reshape(-1)[0]) \
            or int(zero.reshape(-1)[0]) != int(x.zero_point.reshape(-1)[0]):
        return None, []
    top, left, bottom, right = attrs["pads"]
    pads = g.constant(f"{x.quantised}_pads",
                      np.array([0, 0, top, left, 0, 0, bottom, right], np.int64))
    padded, image = g._fresh(f"{quantise.input[0]}_padded"), g._fresh(f"{x.quantised}_padded")
    return image, [
        helper.make_node("Pad", [quantise.input[0], pads], [padded], name=f"{padded}_pad",
                         mode="constant"),
        helper.make_node("QuantizeLinear", [padded, *quantise.input[1:]], [image],
                         name=f"{image}_quantise",
                         **{a.name: helper.get_attribute_value(a) for a in quantise.attribute})]


_CONTRACTIONS = {"MatMul": _matmul, "Gemm": _gemm, "Conv": _conv}


def _constant_float(g: _Graph, name: str) -> np.ndarray | None:
    """A float constant, or the dequantised value of a DQ of one (a bias quantised to int32)."""
    value = g.value(name)
    if value is not None:
        return value.astype(np.float64)
    dq = g.dequantised(name)
    if dq is None or dq.quantised not in g.constants:
        return None
    return _dequantise(g.value(dq.quantised), dq)


def _dequantise(values: np.ndarray, dq: Dequantised) -> np.ndarray:
    shape = [1] * values.ndim
    if dq.scale.size > 1:
        shape[dq.axis % values.ndim] = -1
    return ((values.astype(np.int64) - dq.zero_point.reshape(shape))
            * dq.scale.reshape(shape)).astype(np.float64)


def _integer_product(g: _Graph, index: int, node: onnx.NodeProto, op_type: str,
                     operands: list[str], attrs: dict, scale: np.ndarray, shift: np.ndarray,
                     filter_axis: int, prologue: list[onnx.NodeProto] = ()) -> None:
    """The nodes that replace ``node``: the ``prologue`` making an operand, the integer product,
    its cast, scale and shift."""
    out = node.output[0]
    base = node.name or out
    acc, real = g._fresh(f"{out}_int32"), g._fresh(f"{out}_product")
    nodes = [*prologue,
             helper.make_node(op_type, operands, [acc], name=f"{base}_int8", **attrs),
             helper.make_node("Cast", [acc], [real], name=f"{base}_to_float",
                              to=onnx.TensorProto.FLOAT)]
    scaled = out if not np.any(shift) else g._fresh(f"{out}_scaled")
    nodes.append(helper.make_node("Mul", [real, _per_axis(g, out, "scale", scale, filter_axis)],
                                  [scaled], name=f"{base}_dequantise"))
    if np.any(shift):
        nodes.append(helper.make_node("Add", [scaled, _per_axis(g, out, "shift", shift,
                                                                filter_axis)],
                                      [out], name=f"{base}_bias"))
    g.new_nodes[index] = nodes


def _per_axis(g: _Graph, out: str, what: str, values: np.ndarray, filter_axis: int) -> str:
    """A float32 constant of one value (every filter's alike) or one per filter, shaped to
    broadcast over the product: ``[N]`` for a matmul's columns, ``[C, 1, 1]`` for a Conv's."""
    values = np.asarray(values, np.float64).reshape(-1)
    if np.all(values == values[0]):
        return g.constant(f"{out}_{what}", np.array(values[0], np.float32))
    shaped = values if filter_axis == -1 else values.reshape(-1, 1, 1)
    return g.constant(f"{out}_{what}", shaped.astype(np.float32))


def _rebuild(g: _Graph) -> None:
    nodes = []
    for index, node in enumerate(g.graph.node):
        nodes.extend(g.new_nodes.get(index, [node]))
    del g.graph.node[:]
    g.graph.node.extend(nodes)
    g.graph.initializer.extend(g.new_constants)
    g.new_constants = []


def _fold_constant_dequantisations(g: _Graph) -> None:
    """Every DQ of a constant still read (a float op's weights, a bias) becomes its float value:
    what the folder would have done, had it been let."""
    kept = []
    for node in g.graph.node:
        dq = g.dequantised(node.output[0]) if is_op(node, DEQUANTIZE) else None
        if dq is not None and dq.quantised in g.constants:
            value = _dequantise(g.value(dq.quantised), dq)
            dtype = helper.tensor_dtype_to_np_dtype(g.constants.data_type(node.input[1]))
            g.graph.initializer.append(numpy_helper.from_array(value.astype(dtype),
                                                               node.output[0]))
            continue
        kept.append(node)
    del g.graph.node[:]
    g.graph.node.extend(kept)


def _one_dequantisation_per_reader(graph: onnx.GraphProto) -> None:
    """A DequantizeLinear of an activation read by several nodes becomes one for each: every
    reader's kernel may then dequantise the int8 tensor in its prologue, so what crosses GM
    between kernels is int8 (docs/int8.md, "Regions"); a DQ is one op of the vector unit. The
    first reader (and a graph output, or a read inside a subgraph: not rewired) keep the
    original."""
    readers = readers_of(graph)
    in_subgraphs = names_in_subgraphs(graph)
    constants = {t.name for t in graph.initializer}
    taken = names_in(graph)
    nodes = []
    for node in graph.node:
        nodes.append(node)
        out = node.output[0] if node.output else ""
        if not is_op(node, DEQUANTIZE) or node.input[0] in constants or out in in_subgraphs:
            continue
        for reader in readers.get(out, [])[1:]:
            copy = onnx.NodeProto.FromString(node.SerializeToString())
            copy.output[0] = unused_name(f"{out}_for_{reader.output[0]}", taken)
            copy.name = unused_name(f"{node.name or out}_for_{reader.output[0]}", taken)
            for index, name in enumerate(reader.input):
                if name == out:
                    reader.input[index] = copy.output[0]
            nodes.append(copy)
    del graph.node[:]
    graph.node.extend(nodes)


def _drop_unused(graph: onnx.GraphProto) -> None:
    """Remove the nodes and initializers nothing reads any more (the DQs the rewrite bypassed)."""
    while True:
        read = {name for node in graph.node for name in node.input}
        read |= {o.name for o in graph.output}
        read |= names_in_subgraphs(graph)
        dead = [n for n in graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    unused = [t for t in graph.initializer if t.name not in read]
    for tensor in unused:
        graph.initializer.remove(tensor)


# Canonical forms of an activation's quantisation (registered as the other ops' forms are)

QUANTISATION_FORM = "the kernel generator takes a quantisation of a tensor by one scale"


def _per_tensor(ctx: NodeContext) -> dict:
    """A constant float32 scale and zero point of one element each (``axis`` then says
    nothing); a per-axis or blocked one stays a boundary, computed by onnxruntime."""
    scale, zero = ctx.const(1), ctx.const(2)
    if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
        raise NotCanonical(f"{QUANTISATION_FORM} (per axis)")
    if scale.dtype != np.float32:
        raise NotCanonical(f"{QUANTISATION_FORM} (a {scale.dtype} scale)")
    if ctx.attr("block_size", 0):
        raise NotCanonical(f"{QUANTISATION_FORM} (blocked)")
    return {"scale": float(scale.reshape(-1)[0]),
            "zero_point": 0 if zero is None else int(zero.reshape(-1)[0])}


@normaliser("QuantizeLinear")
def _quantize_linear(ctx: NodeContext) -> dict:
    to = ctx.dtypes.get(ctx.node.output[0])
    if to not in QUANTISED_TYPES:
        raise NotCanonical(f"{QUANTISATION_FORM} (to {onnx.TensorProto.DataType.Name(to or 0)})")
    return {**_per_tensor(ctx), "to": int(to)}


@normaliser("DequantizeLinear")
def _dequantize_linear(ctx: NodeContext) -> dict:
    if ctx.dtypes.get(ctx.node.input[0]) not in QUANTISED_TYPES:
        raise NotCanonical(f"{QUANTISATION_FORM} (of a tensor that is not int8 or uint8)")
    return _per_tensor(ctx)
