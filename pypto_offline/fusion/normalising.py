"""A LayerNorm or an RMSNorm over the last axis as the prologue or the epilogue of a projection
(issue 54, docs/regions.md "Attention"): the kernel normalises whole rows in UB beside the
cube's product."""
from __future__ import annotations

from pypto_offline.fusion.members import made_before
from pypto_offline.importer import ImportedGraph, Node
from pypto_offline.registry.ops import MATMUL, REDUCTION, definition, is_op, kind_of


def normalising_prologue(graph: ImportedGraph, members: list[Node]) -> list[Node]:
    """The LayerNormalization over the last axis making a projection's data operand (a MatMul
    by 2-D weights, or a Gemm), and the elementwise ops making its input from tensors from
    outside the region (BERT's embeddings' sum), when it is the region's only reduction: the
    kernel normalises whole rows in UB and the cube multiplies them (issue 54; before, a
    matmul took no reduction beside it, and each LayerNorm of BERT, ViT and GPT-2 was a kernel
    of its own). Empty if the members are not that."""
    found = _projection_and_norm(graph, members)
    if found is None:
        return []
    root, norm = found
    if is_op(norm, "LayerNormalization"):
        rows = _rows_reshaped(graph, root.inputs[0], norm, members)
        if rows is None:
            return []
        before = made_before(norm, members)
        return [*before, norm, *rows] if all(definition(n.op_type).pointwise for n in before) \
            else []
    # an RMSNorm written as its ops: the mean and the elementwise ops around it make the data
    prologue = made_before(root, members)
    return prologue if norm in prologue and all(
        n is norm or definition(n.op_type).pointwise for n in prologue) else []


def _rows_reshaped(graph: ImportedGraph, tensor: str, norm: Node, members: list[Node]
                   ) -> list[Node] | None:
    """The Reshapes that make ``tensor`` from the LayerNorm's output keeping its last axis
    (GPT-2's ``[1, S, K]`` to the Gemm's ``[S, K]``), none if it is that output; None if it
    is made otherwise."""
    by_output = {name: n for n in members for name in n.outputs}
    reshapes = []
    while tensor not in norm.outputs:
        maker = by_output.get(tensor)
        if maker is None or not is_op(maker, "Reshape") or (
                graph.tensors[maker.outputs[0]].shape or (0,))[-1] != (
                graph.tensors[maker.inputs[0]].shape or (-1,))[-1]:
            return None
        reshapes.append(maker)
        tensor = maker.inputs[0]
    return reshapes[::-1]


def normalising_epilogue(graph: ImportedGraph, members: list[Node]) -> bool:
    """A LayerNormalization over the last axis of what a projection's epilogue makes (the
    residual's sum after an attention's output projection, a model's last LayerNorm), the
    region's only reduction: the kernel normalises the product's whole rows in UB."""
    found = _projection_and_norm(graph, members)
    return found is not None and found[0] in made_before(found[1], members)


def _projection_and_norm(graph: ImportedGraph, members: list[Node]
                         ) -> tuple[Node, Node] | None:
    """The members' one matmul, a projection (a MatMul by 2-D weights, or a Gemm), and their
    one reduction, a LayerNormalization over the last axis or an RMSNorm's mean of squares
    over it (``_mean_of_squared_rows``); None if they are not that."""
    matmuls = [n for n in members if kind_of(n.op_type, n.params) == MATMUL]
    reductions = [n for n in members if kind_of(n.op_type) == REDUCTION]
    if len(matmuls) != 1 or len(reductions) != 1 or not definition(matmuls[0].op_type).projection:
        return None
    (root,), (norm,) = matmuls, reductions
    rank = len(graph.tensors[norm.inputs[0]].shape or ())
    if tuple(norm.params.get("axes", ())) != (rank - 1,) \
            or len(graph.tensors[root.inputs[1]].shape or ()) != 2:
        return None
    if is_op(norm, "LayerNormalization") or _mean_of_squared_rows(graph, norm, members):
        return root, norm
    return None


def _mean_of_squared_rows(graph: ImportedGraph, mean: Node, members: list[Node]) -> bool:
    """A ReduceMean over the last axis, kept, of a member squaring a tensor (``Pow(x, 2)``,
    ``Mul(x, x)``): an RMSNorm written as its ops (LLaMA's)."""
    if not is_op(mean, "ReduceMean") or not mean.params.get("keepdims", 1):
        return False
    (square,) = [n for n in members if mean.inputs[0] in n.outputs] or [None]
    if square is None:
        return False
    if is_op(square, "Mul"):
        return square.inputs[0] == square.inputs[1]
    exponent = graph.constant(square.inputs[1]) if is_op(square, "Pow") else None
    return exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0
