"""BatchNormalization at inference: folded into the Conv, ConvTranspose or Gemm before it, else
turned into its per-channel affine form.

At inference a BatchNormalization is ``y = (x - mean) * scale / sqrt(var + eps) + bias`` per
channel: a scale and a shift, memory-bound. After a convolution (or a Gemm) with constant weights
it disappears into them, as onnxruntime's and onnxsim's optimisers do: onnxscript's rewrite
rules (``onnxscript.rewriter.rules.common._fuse_batchnorm``) rescale the weights and the bias.
Anywhere else it becomes ``Add(Mul(x, s), t)`` with ``s`` and ``t`` per channel, two broadcast
ops that fuse with their neighbours like any other. A BatchNormalization in training mode, with
computed parameters or of unknown rank stays as it is (a boundary, with its reason:
``canonical.py``).

Both rewrites change the model's arithmetic by rounding only; the rewritten model is checked
against the one before on seeded inputs in onnxruntime, and the one before is kept if they
disagree.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.rewriter
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import _fuse_batchnorm

from pypto_offline.importer.shape_probe import static_input_shapes
from pypto_offline.registry.ops import is_op
from pypto_offline.runtime import (TOLERANCE, CannotRun, generate_inputs, magnitude, max_abs_diff,
                                   run_model, within_tolerance)

DEFAULT_EPSILON = 1e-5  # BatchNormalization's default (every opset)


def _inference_only(node: ir.Node) -> bool:
    """Not in training mode (opset 14's attribute; before it, only the first output used)."""
    mode = node.attributes.get("training_mode")
    return (mode is None or mode.as_int() == 0) and not any(
        output.uses() or output.is_graph_output() for output in node.outputs[1:])


def _with_inference_check(rule_class):
    """The library's rule, refusing a BatchNormalization in training mode, whose batch
    statistics no fold can know."""
    class InferenceOnly(rule_class):
        def check(self, context, x, inbound_out, batchnorm_out):
            if not _inference_only(batchnorm_out.producer()):
                return pattern.MatchResult().fail("BatchNormalization in training mode")
            return super().check(context, x, inbound_out, batchnorm_out)
    InferenceOnly.__name__ = rule_class.__name__
    return InferenceOnly().rule()


class BatchNormAsAffine(pattern.RewriteRuleClassBase):
    """``BatchNormalization(x)`` with constant parameters → ``Add(Mul(x, s), t)``, ``s`` and
    ``t`` shaped ``[C, 1, ..., 1]`` to broadcast over x's channel axis (axis 1)."""

    def pattern(self, op, x, scale, bias, mean, var):
        return op.BatchNormalization(x, scale, bias, mean, var, _outputs=["normalised"])

    def check(self, context, x, scale, bias, mean, var, normalised):
        result = pattern.MatchResult()
        if not _inference_only(normalised.producer()):
            return result.fail("BatchNormalization in training mode")
        if any(p.const_value is None for p in (scale, bias, mean, var)):
            return result.fail("its parameters are computed at run time")
        if x.shape is None or len(x.shape) < 2:
            return result.fail("the input's rank is unknown")
        return result

    def rewrite(self, op, x, scale, bias, mean, var, normalised):
        node = normalised.producer()
        epsilon = node.attributes.get_float("epsilon", DEFAULT_EPSILON)
        gamma, beta, mu, sigma2 = (p.const_value.numpy().astype(np.float64)
                                   for p in (scale, bias, mean, var))
        s = gamma / np.sqrt(sigma2 + epsilon)
        shape = (-1,) + (1,) * (len(x.shape) - 2)
        dtype = scale.const_value.numpy().dtype
        name = node.name or normalised.name
        factor = op.initializer(ir.tensor(s.reshape(shape).astype(dtype)), name=f"{name}_scale")
        shift = op.initializer(ir.tensor((beta - mu * s).reshape(shape).astype(dtype)),
                               name=f"{name}_shift")
        return op.Add(op.Mul(x, factor), shift)


INTO_WEIGHTS = pattern.RewriteRuleSet([
    _with_inference_check(_fuse_batchnorm.FuseBatchNormIntoConv),
    _with_inference_check(_fuse_batchnorm.FuseBatchNormIntoConvTranspose),
    _with_inference_check(_fuse_batchnorm.FuseBatchNormIntoGemm)])
AS_AFFINE = pattern.RewriteRuleSet([BatchNormAsAffine().rule()])


def count(model: onnx.ModelProto) -> int:
    return sum(is_op(node, "BatchNormalization") for node in model.graph.node)


def fold_batch_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every inference BatchNormalization folded into the weights before it, or
    else made a per-channel affine, when onnxruntime computes the same with it as without on
    seeded inputs (``same_outputs``); else the model itself."""
    if not count(model) or static_input_shapes(model) is None:
        return model  # nothing to fold, or no inputs to check a fold on
    ir_model = ir.serde.deserialize_model(model)
    ir_model = onnxscript.rewriter.rewrite(ir_model, INTO_WEIGHTS)
    ir_model = onnxscript.rewriter.rewrite(ir_model, AS_AFFINE)
    folded = ir.serde.serialize_model(ir_model)
    return folded if count(folded) < count(model) and same_outputs(model, folded) else model


def same_outputs(model: onnx.ModelProto, rewritten: onnx.ModelProto) -> bool:
    """Whether the rewritten model's outputs equal the model's on seeded inputs, up to the
    verification's tolerance for their dtype relative to their magnitude (a fold rounds each
    layer's weights once: deep CNNs' large activations differ by more than the tolerance in
    absolute terms). A model onnxruntime cannot run is not rewritten."""
    feeds = generate_inputs(model, seed=0)
    try:
        expected, actual = run_model(model, feeds), run_model(rewritten, feeds)
    except CannotRun:
        return False
    for name, want in expected.items():
        got = actual.get(name)
        if not isinstance(want, np.ndarray) or not isinstance(got, np.ndarray):
            return False
        if not within_tolerance(max_abs_diff(want, got), TOLERANCE.get(str(want.dtype), 0.0),
                                magnitude(want)):
            return False
    return True
