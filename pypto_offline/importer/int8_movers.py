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
as it is. A quantised Concat is taken apart instead (``quantise_concat_parts``): its parts
rarely share the output's scale, so each part is quantised to it, and the Concat moves int8.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from pypto_offline.importer.graph_index import (Constants, forget_type, names_in_subgraphs,
                                               readers_of)
from pypto_offline.importer.names import names_in, unused_name
from pypto_offline.registry.ops import is_op

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
# The ops that move elements and compute none: each output element is one input element.
# (A Concat: ``quantise_concat_parts``. A MaxPool or a nearest Resize commute as well, but
# PyPTO 0.2.0 fills no int8 tile for a padded pooling: they stay float.)
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
        if not is_op(node, MOVERS):
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
        if same is not node and not any(name in kept_names for name in node.output):
            _read_instead(node, same, readers)
            dropped.add(id(node))
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return moved


def quantise_concat_parts(model: onnx.ModelProto, constants: Constants) -> int:
    """``Q(Concat(x1, ..., xn))`` written ``Concat(Q(x1), ..., Q(xn))``: the same values (Q is
    elementwise, of one scale), and the Concat then moves int8, written part by part into its
    kernel's output (``codegen.movement._assemble_concat``) where before it ran under a tile
    holding the whole concatenated axis, fp32, quantised after. Each part keeps its own Q, even
    a DQ of the output's own scale (where ``Q(DQ(q)) = q``): nudenet's SPPF concat of raw int8
    parts made its MaxPools' region 870 us in PyPTO's cost model against 47 us unfused, and it
    fell back split. How many concats. (docs/int8.md, "Data movement on int8".)"""
    graph = model.graph
    readers = readers_of(graph)
    kept_names = {o.name for o in graph.output} | names_in_subgraphs(graph)
    taken = names_in(graph)
    nodes, dropped, count = [], set(), 0
    for node in graph.node:
        q = _only_reader(readers, node.output[0], kept_names) if is_op(node, "Concat") \
            else None
        if q is None or not _per_tensor(q, QUANTIZE, constants):
            nodes.append(node)
            continue
        for index, name in enumerate(node.input):
            part = unused_name(f"{name}_quantised_for_{q.output[0]}", taken)
            nodes.append(helper.make_node(QUANTIZE, [name, *q.input[1:]], [part],
                                          name=unused_name(f"{part}_q", taken)))
            node.input[index] = part
        forget_type(graph, node.output[0])
        node.output[0] = q.output[0]
        dropped.add(id(q))
        nodes.append(node)
        count += 1
    kept = [n for n in nodes if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    return count


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
    if node is None or not is_op(node, op_type) \
            or len(node.input) < 3 or any(a.name in ("block_size", "output_dtype")
                                          and a.i for a in node.attribute):
        return False
    scale, zero = constants.get(node.input[1]), constants.get(node.input[2])
    # a positive finite scale: Q(DQ(q)) = q needs one (a hostile scale of 0 makes it NaN)
    return scale is not None and zero is not None and scale.size == 1 and zero.size == 1 \
        and bool(np.isfinite(scale).all() and (scale > 0).all())


def _parameters(node: onnx.NodeProto, constants: Constants) -> tuple:
    """Scale, zero point and the quantised type, compared by value (names may differ)."""
    scale, zero = constants[node.input[1]], constants[node.input[2]]
    return (scale.dtype.str, float(scale.reshape(-1)[0]), zero.dtype.str,
            int(zero.reshape(-1)[0]))

