"""Data movement on the quantised tensor: ``Q(move(DQ(x, s, z)), s, z) = move(x)``.

onnxruntime's ``quantize_static`` writes a Reshape, Transpose, Split or Slice of a quantised
activation between a DequantizeLinear and a QuantizeLinear, both with the input's scale and zero
point (it shares them across ops that only move data). Compiled as written, the kernel
dequantises, moves fp32 and quantises again: vector work, and tiles of 4-byte elements where the
tensor is 1 byte. Moving elements commutes with the elementwise (de)quantisation, and
``Q(DQ(q)) = q`` when both use the same scale and zero point (``(q - z) * s / s`` is ``q - z``
within far less than half a step for any 8-bit ``q``), so the op is rewritten to move the
quantised tensor itself: exact, as onnxruntime's own QDQ optimiser drops such pairs
(docs/int8.md, "Data movement on int8").

An op whose output the graph returns, or that anything but that one QuantizeLinear reads, stays
as it is.
"""
from __future__ import annotations

import onnx

from pypto_offline.importer.graph_index import (Constants, forget_type, names_in_subgraphs,
                                               readers_of)

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
# The ops that move elements and compute none: each output element is one input element.
# A Concat of one scale (nudenet's SPPF: a conv's output and three MaxPools of it) commutes
# too, but its int8 kernel ran 816 us in PyPTO's cost model against 23 us for its ops, and the
# region fell back split: 7 kernels more. A MaxPool or a nearest Resize commute as well, but
# PyPTO 0.2.0 fills no int8 tile for a padded pooling. These stay float.
MOVERS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Split", "Slice"})


def move_quantised(model: onnx.ModelProto, constants: Constants) -> int:
    """Rewrite ``model`` in place (a copy the caller made); how many ops now move 8-bit
    tensors. ``constants`` indexes the model's graph."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    readers = readers_of(graph)
    kept_names = {o.name for o in graph.output} | names_in_subgraphs(graph)
    moved, dropped, rewritten = 0, set(), {}
    for node in graph.node:
        if node.op_type not in MOVERS or node.domain not in ("", "ai.onnx"):
            continue
        dequantisations = [producer.get(node.input[0])]
        quantisations = [_only_reader(readers, out, kept_names) for out in node.output]
        if not all(_per_tensor(n, DEQUANTIZE, constants) for n in dequantisations) \
                or not all(_per_tensor(n, QUANTIZE, constants) for n in quantisations):
            continue
        wanted = _parameters(quantisations[0], constants)
        if any(_parameters(n, constants) != wanted for n in dequantisations + quantisations):
            continue
        for index, dq in enumerate(dequantisations):
            node.input[index] = dq.input[0]
        for index, q in enumerate(quantisations):
            producer[q.output[0]] = node
            forget_type(graph, node.output[index])
            node.output[index] = q.output[0]
            dropped.add(id(q))
        moved += 1
        same = rewritten.setdefault(_computation(node, constants), node)
        if same is not node:
            _read_instead(node, same, readers)
            dropped.add(id(node))
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return moved


def _computation(node: onnx.NodeProto, constants: Constants) -> tuple:
    """What a node computes: its op, attributes and inputs (a constant one by its value: each
    of ViT's reshapes has a shape of its own), not its name or outputs."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for field in ("input", "output", "name"):
        copy.ClearField(field)
    inputs = tuple((constants[name].dtype.str, constants[name].shape,
                    constants[name].tobytes()) if name in constants else name
                   for name in node.input)
    return copy.SerializeToString(deterministic=True), inputs


def _read_instead(duplicate: onnx.NodeProto, first: onnx.NodeProto, readers) -> None:
    """The readers of ``duplicate``'s outputs read ``first``'s (the same values) instead. A
    tensor moved twice alike became one tensor written to several kernel outputs: the quantised
    LayerNorm feeding ViT's three projections, reshaped three times, crashed PyPTO 0.2.0."""
    for mine, theirs in zip(duplicate.output, first.output):
        for reader in readers.get(mine, []):
            for index, name in enumerate(reader.input):
                if name == mine:
                    reader.input[index] = theirs
            readers.setdefault(theirs, []).append(reader)


def _only_reader(readers, tensor: str, kept_names: set[str]) -> onnx.NodeProto | None:
    who = readers.get(tensor, [])
    return who[0] if len(who) == 1 and tensor not in kept_names else None


def _per_tensor(node: onnx.NodeProto | None, op_type: str, constants: Constants) -> bool:
    """A (de)quantisation by one constant scale and zero point, of ONNX's own domain."""
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx") \
            or len(node.input) < 3 or any(a.name in ("block_size", "output_dtype")
                                          and a.i for a in node.attribute):
        return False
    scale, zero = constants.get(node.input[1]), constants.get(node.input[2])
    return scale is not None and zero is not None and scale.size == 1 and zero.size == 1


def _parameters(node: onnx.NodeProto, constants: Constants) -> tuple:
    """Scale, zero point and the quantised type, compared by value (names may differ)."""
    scale, zero = constants[node.input[1]], constants[node.input[2]]
    return (scale.dtype.str, float(scale.reshape(-1)[0]), zero.dtype.str,
            int(zero.reshape(-1)[0]))

