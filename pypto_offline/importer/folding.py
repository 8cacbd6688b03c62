"""Compile-time folding with onnxscript's optimizer over onnx-ir.

Constant nodes become initializers, then everything computable from constants and static shapes
(Shape → Gather → Concat → Reshape, ConstantOfShape, Range, an If with a constant condition, ...)
is evaluated by onnxscript's folder and replaced by its value.
"""
from __future__ import annotations

import logging
from typing import Mapping

import onnx
import onnx_ir as ir
import onnxscript.optimizer

from pypto_offline.importer.quantised import keeps_quantised
from pypto_offline.registry.ops import is_op

# Element counts: large enough to fold weight transposes and shape tables, small enough that folding
# never materialises a broadcast activation as a constant.
INPUT_SIZE_LIMIT = 1 << 22
OUTPUT_SIZE_LIMIT = 1 << 22
MAX_ROUNDS = 6

# The folder logs each node it tried and could not evaluate; those are expected, not the user's
# concern. A NullHandler keeps them off stderr while a configured root logger still sees them.
logging.getLogger("onnxscript.optimizer").addHandler(logging.NullHandler())


def _should_fold(node: ir.Node) -> bool | None:
    # onnxscript leaves ConstantOfShape alone by default; exporters build pads and masks with it.
    # A DequantizeLinear of int8 weights is kept for importer/quantised.py, which multiplies
    # the int8 values on the cube (and folds the DQs it does not take itself).
    if keeps_quantised(node):
        return False
    return True if is_op(node, "ConstantOfShape") else None


def fold(model: onnx.ModelProto, known_shapes: Mapping[str, tuple[int, ...]] | None = None
         ) -> onnx.ModelProto:
    """Return a folded copy; ``known_shapes`` seeds value shapes the folder could not infer."""
    ir_model = ir.serde.deserialize_model(model)
    if known_shapes:
        _seed_shapes(ir_model.graph, known_shapes)
    ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(ir_model)
    for _ in range(MAX_ROUNDS):
        result = onnxscript.optimizer.fold_constants(
            ir_model, onnx_shape_inference=True, input_size_limit=INPUT_SIZE_LIMIT,
            output_size_limit=OUTPUT_SIZE_LIMIT, should_fold=_should_fold)
        onnxscript.optimizer.remove_unused_nodes(ir_model)
        if not result.modified:
            break
    return ir.serde.serialize_model(ir_model)


def _seed_shapes(graph: ir.Graph, known: Mapping[str, tuple[int, ...]]) -> None:
    for node in graph:
        for value in node.outputs:
            if value.name in known:
                value.shape = ir.Shape(list(known[value.name]))
