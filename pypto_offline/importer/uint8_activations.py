"""uint8 activations written as int8 ones: ``Q_uint8(x, s, z) - 128 = Q_int8(x, s, z - 128)``.

onnxruntime's ``quantize_static`` quantises activations to uint8 unless told otherwise, and
PyPTO 0.2.0's cube multiplies int8 by int8 (docs/int8.md). Shifting a quantised tensor and its
zero point by 128 changes no value anywhere: the quantisation saturates to [0, 255] before the
shift and to [-128, 127] after it, the same integers less 128, and every DequantizeLinear of it
computes ``(q - z) * s`` with both sides shifted. So each per-tensor ``QuantizeLinear`` to uint8
whose tensor only DequantizeLinear nodes read (with its scale and zero point) is made one to
int8, with them; ``importer/quantised.py`` then makes the contractions around it integer as it
does for an int8 model. A quantised tensor the graph returns, or that anything else reads, stays
uint8.
"""
from __future__ import annotations

import numpy as np
import onnx
from pypto_offline.importer.graph_index import Constants, forget_type, readers_of
from pypto_offline.importer.names import names_in, unused_name
from pypto_offline.registry.ops import is_op

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
SHIFT = 128  # uint8 - 128 is int8


def as_int8_activations(model: onnx.ModelProto, constants: Constants) -> int:
    """Rewrite ``model`` in place (a copy the caller made); how many quantisations it shifted.
    ``constants`` indexes the model's graph."""
    graph = model.graph
    readers = readers_of(graph)
    returned = {o.name for o in graph.output}
    taken = names_in(graph)
    shifted = 0
    for node in graph.node:
        if not is_op(node, QUANTIZE) \
                or node.output[0] in returned:
            continue
        zero = _uint8_zero_point(node, constants)
        dequantisations = readers.get(node.output[0], [])
        if zero is None or not dequantisations or not all(
                _dequantises(reader, node, constants) for reader in dequantisations):
            continue
        name = unused_name(f"{node.output[0]}_int8_zero_point", taken)
        graph.initializer.append(constants.record(np.int8(int(zero) - SHIFT), name))
        for user in [node, *dequantisations]:
            _set_zero_point(user, name)
        forget_type(graph, node.output[0])
        shifted += 1
    return shifted


def _uint8_zero_point(node: onnx.NodeProto, constants: Constants) -> np.ndarray | None:
    """The zero point of a per-tensor quantisation to uint8 (absent: 0 of uint8), else None."""
    if len(node.input) < 2 or constants.get(node.input[1]) is None \
            or constants[node.input[1]].size != 1:
        return None
    if len(node.input) < 3 or not node.input[2]:
        return np.uint8(0)
    zero = constants.get(node.input[2])
    if zero is None or zero.dtype != np.uint8 or zero.size != 1:
        return None
    return zero.reshape(())


def _dequantises(reader: onnx.NodeProto, quantise: onnx.NodeProto, constants: Constants) -> bool:
    """Whether ``reader`` dequantises the tensor with the quantisation's own scale and zero
    point (the same values: names may differ)."""
    if not is_op(reader, DEQUANTIZE) \
            or reader.input[0] != quantise.output[0]:
        return False
    return all(_same_constant(constants, _input(reader, i), _input(quantise, i))
               for i in (1, 2))


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _same_constant(constants: Constants, a: str, b: str) -> bool:
    if a == b:
        return True
    left, right = constants.get(a), constants.get(b)
    return left is not None and right is not None and left.dtype == right.dtype \
        and np.array_equal(left, right)


def _set_zero_point(node: onnx.NodeProto, name: str) -> None:
    while len(node.input) < 3:
        node.input.append("")
    node.input[2] = name
