"""One attention mask per layer: an additive mask the graph makes once and every layer's
scores read becomes one copy per reader, so each attention's kernel can make its own from the
attention mask input and the causal band, and no kernel writes the ``[S_q, S_k]`` mask to GM
for the others to read (``fusion.attention.attention_core``; docs/regions.md, "Attention").

The copied ops are the mask's last steps (``MASK_OPS``: comparisons, logic, Where, Cast; and
reshapes, ``MASK_VIEWS``), each read by the next only, from the ``Where`` that turns the
condition into the additive values down to tensors read elsewhere or made otherwise (GPT-2's
attention mask after its GatherND, a constant band: importer/bands.py). A few vector ops per layer, against a
kernel launch and the mask's ``S_q x S_k`` elements written once and read once per layer; as
``quantised._one_dequantisation_per_reader`` does for a DequantizeLinear.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import onnx

from pypto_offline.importer.graph_index import names_in_subgraphs, readers_of
from pypto_offline.importer.names import names_in, unused_name
from pypto_offline.registry.ops import is_op

# The ops that make an attention's mask from tensors from outside its core and join each core
# (fusion.attention.attention_core)
MASK_OPS = frozenset({"And", "Or", "Not", "Xor", "Where", "Cast", "Equal", "Greater", "Less",
                      "GreaterOrEqual", "LessOrEqual"})
# and the reshapes among them (the attention mask input's [B, S] as [B, 1, 1, S]), which a
# region's program holds as one Reshape (fusion/program.py)
MASK_VIEWS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten"})

Op = TypeVar("Op")  # a Node, or a region program's RegionOp: op_type, inputs, outputs


def mask_makers(ops: Sequence[Op], from_outside: Callable[[str], bool]) -> list[Op]:
    """The ops, in order, that make tensors from tensors from outside and each other only, of
    the ``MASK_OPS`` and ``MASK_VIEWS`` (an attention core's mask, made by each head:
    fusion.attention.attention_core, codegen.matmul.batched_matmul_loop)."""
    mask, made = [], set()
    for op in ops:
        if is_op(op, MASK_OPS | MASK_VIEWS) \
                and all(from_outside(t) or t in made for t in op.inputs):
            mask.append(op)
            made.update(op.outputs)
    return mask


def one_mask_per_reader(graph: onnx.GraphProto) -> dict[str, str]:
    """Copy each shared additive mask (a ``Where`` of two one-element constants read only by
    Adds, two or more) and its own ``MASK_OPS`` chain once per reader but the first; each
    copy's output → the output it copies (of the same type and shape)."""
    readers = readers_of(graph)
    producer = {name: node for node in graph.node for name in node.output}
    scalars = {t.name for t in graph.initializer if _size(t) == 1}
    kept = names_in_subgraphs(graph) | {o.name for o in graph.output}
    taken = names_in(graph)
    position = {id(node): index for index, node in enumerate(graph.node)}
    copies: dict[int, list[onnx.NodeProto]] = {}
    originals: dict[str, str] = {}
    for node in graph.node:
        if not _shared_additive_mask(node, readers, scalars, kept):
            continue
        chain = _own_chain(node, producer, readers, kept, position)
        for reader in readers[node.output[0]][1:]:
            copies.setdefault(id(node), []).extend(_copy_for(chain, reader, taken, originals))
    if not copies:
        return originals
    nodes = []
    for node in graph.node:
        nodes.append(node)
        nodes.extend(copies.get(id(node), ()))
    del graph.node[:]
    graph.node.extend(nodes)
    return originals


def _size(tensor: onnx.TensorProto) -> int:
    size = 1
    for dim in tensor.dims:
        size *= dim
    return size


def _shared_additive_mask(node: onnx.NodeProto, readers, scalars: set[str], kept: set[str]
                          ) -> bool:
    who = readers.get(node.output[0] if node.output else "", [])
    return is_op(node, "Where") \
        and len(node.input) == 3 and all(name in scalars for name in node.input[1:]) \
        and node.output[0] not in kept and len(who) > 1 \
        and all(is_op(r, "Add") for r in who)


def _own_chain(where: onnx.NodeProto, producer, readers, kept: set[str],
               position: dict[int, int]) -> list[onnx.NodeProto]:
    """The ``Where`` and the ``MASK_OPS`` and ``MASK_VIEWS`` before it read by nothing else,
    in graph order."""
    chain, todo = [where], [where]
    while todo:
        node = todo.pop()
        for name in node.input:
            made = producer.get(name)
            if made is not None and is_op(made, MASK_OPS | MASK_VIEWS) and name not in kept \
                    and [r.output[0] for r in readers[name]] == [node.output[0]] \
                    and made not in chain:
                chain.append(made)
                todo.append(made)
    return sorted(chain, key=lambda n: position[id(n)])


def _copy_for(chain: list[onnx.NodeProto], reader: onnx.NodeProto, taken: set[str],
              originals: dict[str, str]) -> list[onnx.NodeProto]:
    """The chain copied under new names for ``reader``, which now reads the copy; each new
    output's original recorded in ``originals``."""
    renamed: dict[str, str] = {}
    copies = []
    for node in chain:
        copy = onnx.NodeProto.FromString(node.SerializeToString())
        for index, name in enumerate(copy.input):
            copy.input[index] = renamed.get(name, name)
        for index, name in enumerate(copy.output):
            renamed[name] = copy.output[index] = unused_name(f"{name}_for_{reader.output[0]}",
                                                             taken)
            originals[renamed[name]] = name
        copy.name = unused_name(f"{node.name or node.output[0]}_for_{reader.output[0]}", taken)
        copies.append(copy)
    out = chain[-1].output[0]
    for index, name in enumerate(reader.input):
        if name == out:
            reader.input[index] = renamed[out]
    return copies
