"""An attention's core as one region (issue 54, docs/regions.md "Attention"): the scores'
batched MatMul, their elementwise epilogue and mask, the Softmax over the keys, the product by
the values and the heads' merge, which the kernel generator runs as a loop over the heads
(``codegen.matmul.batched_matmul_loop``)."""
from __future__ import annotations

from typing import Mapping

from pypto_offline.fusion.members import chain_into, outputs_of, read_beyond
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.importer.masks import mask_makers
from pypto_offline.registry.ops import MATMUL, QUANTISATION_OPS, VIEW, definition, is_op, kind_of


def attention_core(graph: ImportedGraph, members: list[Node],
                   readers: Mapping[str, list[str]]) -> bool:
    """An attention's scores and what follows them (issue 54, docs/regions.md "Attention"):
    a batched MatMul of two operands from outside (Q and Kᵀ, per head; or the transposes that
    split their heads, ``_heads_split``), elementwise ops on its product with operands from
    outside (the scale, a mask, a position bias), one Softmax over its last axis, and maybe a
    second batched MatMul of the probabilities by an operand from outside (V) followed by the
    reshapes and transposes that merge the heads; only its last tensor read beyond it; and
    the ops making its mask from tensors from outside (``importer.masks``: the attention mask
    input, a causal band), once per layer. The kernel runs it as a loop over the heads, each
    head's scores kept in UB between the two products (``codegen.matmul.batched_matmul_loop``);
    without it a MatMul took no reduction beside it and an attention was three kernels."""
    matmuls = [n for n in members if kind_of(n.op_type, n.params) == MATMUL]
    softmaxes = [n for n in members if is_op(n, "Softmax")]
    # a quantised attention's Q/DQ around each op are not what the loop lowers: it keeps the
    # regions it had (docs/int8.md); the counts first, the readers beyond only then (every
    # merge of a region holding a matmul asks)
    if any(is_op(n, QUANTISATION_OPS) for n in members) \
            or not 1 <= len(matmuls) <= 2 or len(softmaxes) > 1 \
            or any(not is_op(m, "MatMul") or not is_batched(graph, m) for m in matmuls):
        return False
    beyond = read_beyond(members, graph, readers)
    if len(beyond) != 1:
        return False
    made = outputs_of(members)
    mask = mask_makers(members, lambda t: t not in made)
    core = [n for n in members if n not in mask]
    # the mask's tensors are operands from outside to the rest of the core
    produced = outputs_of(core)
    scores, *values = matmuls
    heads = _heads_split(core, scores, values, produced)
    if any(name in produced - outputs_of(heads) for name in scores.inputs):
        return False
    if not softmaxes:  # as the region grows: the scores, their epilogue and their heads split
        (last,) = [n for n in core if beyond[0] in n.outputs]
        chain = _scores_chain(last, scores, core, produced)
        return (bool(heads) or bool(mask)) and not values and chain is not None \
            and len(heads) + len(chain) == len(core) and _masks_scores(mask, chain)
    chain = _scores_chain(softmaxes[0], scores, core, produced)
    return chain is not None and _masks_scores(mask, chain) and _probabilities_and_values(
        graph, core, scores, values, softmaxes[0], heads, chain, produced)


def _masks_scores(mask: list[Node], chain: list[Node]) -> bool:
    """Whether what the mask makers write is read by them or the scores' elementwise ops."""
    made = outputs_of(mask)
    readers = [*mask, *(n for n in chain[1:] if definition(n.op_type).pointwise)]
    return all(t in {name for n in readers for name in n.inputs} for t in made)


def _probabilities_and_values(graph: ImportedGraph, members: list[Node], scores: Node,
                              values: list[Node], softmax: Node, heads: list[Node],
                              chain: list[Node], produced: set[str]) -> bool:
    """``attention_core`` from its Softmax on (``chain``: the scores up to it): over the
    scores' last axis, maybe cast (an fp32 Softmax of a mixed precision mode before fp16
    values), multiplied by values from outside (or their heads split), the heads merged
    after."""
    rank = len(graph.tensors[softmax.inputs[0]].shape or ())
    if tuple(softmax.params.get("axes", ())) != (rank - 1,):
        return False
    casts = [n for n in members if is_op(n, "Cast") and n.inputs[0] in softmax.outputs]
    probabilities = outputs_of([softmax, *casts])
    if any(v.inputs[1] in produced - outputs_of(heads) or v.inputs[0] not in probabilities
           for v in values):
        return False
    rest = [n for n in members if n not in chain and n not in values and n not in casts
            and n not in heads]
    return all(values and (kind_of(n.op_type, n.params) == VIEW or is_op(n, "Transpose"))
               for n in rest)


def _scores_chain(last: Node, scores: Node, members: list[Node], produced: set[str]
                  ) -> list[Node] | None:
    """The scores' MatMul, the elementwise ops on its product up to ``last`` (a Softmax, or
    the last of them) and ``last``, in order; None if they are not that."""
    chain = [] if last is scores else chain_into(last, members, produced - set(scores.inputs))
    if chain is None or (chain and chain[0] is not scores):
        return None
    chain = chain + [last]
    return chain if all(definition(n.op_type).pointwise for n in chain[1:-1]) and (
        last is scores or definition(last.op_type).pointwise or is_op(last, "Softmax")) \
        else None


# Each operand's transpose splitting the heads of a [B, S, H, D] projection, which the loop
# reads as a view of its head (``codegen.matmul``): Q and V to [B, H, S, D], K to [B, H, D, S]
HEADS_SPLIT = {"q": (0, 2, 1, 3), "kt": (0, 2, 3, 1), "v": (0, 2, 1, 3)}


def _heads_split(members: list[Node], scores: Node, values: list[Node],
                 produced: set[str]) -> list[Node]:
    """The members that split a projection's heads for the core's operands (``HEADS_SPLIT``)
    from a tensor from outside: ViT's, whose 65 tokens no projection's epilogue transposes
    (``KernelSupport.matmul_reorder_align``), were kernels of their own."""
    operands = {scores.inputs[0]: HEADS_SPLIT["q"], scores.inputs[1]: HEADS_SPLIT["kt"],
                **{v.inputs[1]: HEADS_SPLIT["v"] for v in values}}
    return [n for n in members if is_op(n, "Transpose") and n.inputs[0] not in produced
            and operands.get(n.outputs[0]) == tuple(n.params.get("perm", ()))]


def is_batched(graph: ImportedGraph, matmul: Node) -> bool:
    """A MatMul of two operands of one rank of at least 3 and the same batch axes."""
    left, right = (graph.tensors[name].shape or () for name in matmul.inputs[:2])
    return len(left) == len(right) >= 3 and tuple(left[:-2]) == tuple(right[:-2])
