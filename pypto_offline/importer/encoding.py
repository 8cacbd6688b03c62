"""Canonical parameters → ONNX nodes valid at a given opset.

The one place that knows each in-scope op's encoding per opset (attributes before opset 10/11/13,
inputs after). The importer uses it to write the normalised graph (parameters become
initializers); fusion uses it to write function bodies (parameters become Constant nodes, since a
function has no initializers and must use the model's opset).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from pypto_offline.importer.canonical import axes_as_input
from pypto_offline.registry.attributes import register_table
from pypto_offline.registry.ops import GLOBAL_POOL_OPS, POOL_OPS, REDUCE_OPS

# Turns a parameter (its name and value) into the name of a tensor holding it.
MakeConstant = Callable[[str, np.ndarray], str]

# A Slice end below -dim stays below 0 after ONNX adds dim, so it clamps to 'past the front'.
BEFORE_FRONT = -(2**63)

def encode(op_type: str, params: Mapping[str, Any], inputs: Sequence[str], outputs: Sequence[str],
           opset: int, dtype: int, make_constant: MakeConstant, name: str = "") -> onnx.NodeProto:
    """One node computing ``op_type`` with ``params`` on the data ``inputs``.

    ``dtype`` is the element type of the first data input (for Pad's and Clip's scalars)."""
    encoder = ENCODERS.get(op_type)
    if encoder is None:  # a new op must say how it is written, not default to attributes
        raise ValueError(f"no encoding for {op_type}: add it to encoding.ENCODERS")
    node_inputs, attrs = encoder(params, list(inputs), opset, _Constants(make_constant, dtype))
    return helper.make_node(op_type, node_inputs, list(outputs), name=name, **attrs)


class _Constants:
    def __init__(self, make_constant: MakeConstant, dtype: int):
        self._make = make_constant
        self._np_dtype = helper.tensor_dtype_to_np_dtype(dtype) if dtype else np.float32

    def ints(self, param: str, values) -> str:
        return self._make(param, np.asarray(values, dtype=np.int64))

    def scalar(self, param: str, value) -> str:
        return self._make(param, np.asarray(value, dtype=self._np_dtype))

    def array(self, param: str, value) -> str:
        return self._make(param, np.asarray(value))


def _slice(p, inputs, opset, const):
    rank = len(p["starts"])
    ends = [BEFORE_FRONT if end == -1 and step < 0 else end
            for end, step in zip(p["ends"], p["steps"])]
    if opset < 10:
        return inputs, {"starts": list(p["starts"]), "ends": ends, "axes": list(range(rank))}
    return inputs + [const.ints("starts", p["starts"]), const.ints("ends", ends),
                     const.ints("axes", range(rank)), const.ints("steps", p["steps"])], {}


def _pad(p, inputs, opset, const):
    if opset < 11:
        return inputs, {"pads": list(p["pads"]), "mode": p["mode"], "value": float(p["value"] or 0)}
    extra = [const.scalar("value", p["value"])] if p["mode"] == "constant" else []
    return inputs + [const.ints("pads", p["pads"])] + extra, {"mode": p["mode"]}


def _tile(p, inputs, opset, const):
    return inputs + [const.ints("repeats", p["repeats"])], {}


def _expand(p, inputs, opset, const):
    return inputs + [const.ints("shape", p["shape"])], {}


def _split(p, inputs, opset, const):
    if opset < 13:
        return inputs, {"axis": p["axis"], "split": list(p["sizes"])}
    return inputs + [const.ints("split", p["sizes"])], {"axis": p["axis"]}


def _axes(p, inputs, opset, const):
    if opset < 13:
        return inputs, {"axes": list(p["axes"])}
    return inputs + [const.ints("axes", p["axes"])], {}


def _reshape(p, inputs, opset, const):
    shape = list(p["shape"])
    if opset < 5:
        return inputs, {"shape": shape}
    attrs = {"allowzero": 1} if 0 in shape and opset >= 14 else {}
    return inputs + [const.ints("shape", shape)], attrs


def _gather(p, inputs, opset, const):
    return inputs + [const.array("indices", np.asarray(p["indices"], np.int64))], {"axis": p["axis"]}


def _clip(p, inputs, opset, const):
    if opset < 11:
        return inputs, {"min": float(p["min"]), "max": float(p["max"])}
    extra = ["" if p["min"] is None else const.scalar("min", p["min"]),
             "" if p["max"] is None else const.scalar("max", p["max"])]
    while extra and not extra[-1]:
        extra.pop()
    return inputs + extra, {}


def _reduce(op_type):
    def encoder(p, inputs, opset, const):
        if axes_as_input(op_type, opset):
            return inputs + [const.ints("axes", p["axes"])], {"keepdims": p["keepdims"]}
        return inputs, {"axes": list(p["axes"]), "keepdims": p["keepdims"]}
    return encoder


def _softmax(p, inputs, opset, const):
    """Canonical axes are trailing (before opset 13, every axis from ``axis`` on)."""
    if opset >= 13 and len(p["axes"]) != 1:
        raise ValueError(f"softmax over axes {p['axes']} has no single-axis form at opset {opset}")
    return inputs, {"axis": p["axes"][0]}


def _layer_normalization(p, inputs, opset, const):
    return inputs, {"axis": p["axes"][0], "epsilon": p["epsilon"], "stash_type": p["stash_type"]}


def _instance_normalization(p, inputs, opset, const):
    return inputs, {"epsilon": p["epsilon"]}


def _group_normalization(p, inputs, opset, const):
    stash = {"stash_type": p["stash_type"]} if opset >= 21 else {}
    return inputs, {"epsilon": p["epsilon"], "num_groups": p["groups"], **stash}


def _window(p, inputs, opset, const):
    """The window, strides and explicit pads (``auto_pad`` and ``ceil_mode`` resolved) of a
    pooling."""
    return inputs, {name: list(value) if isinstance(value, tuple) else value
                    for name, value in p.items()}


def _conv(p, inputs, opset, const):
    """A Conv's window, strides, dilations, group and pads; ``depthwise`` is the canonical
    form's own note (importer/contractions.py), not an attribute."""
    return _window({k: v for k, v in p.items() if k != "depthwise"}, inputs, opset, const)


def _quantise(p, inputs, opset, const):
    """A per-tensor QuantizeLinear: its scale, and its zero point in the type it writes."""
    zero = np.asarray(p["zero_point"], helper.tensor_dtype_to_np_dtype(p["to"]))
    return inputs + [const.array("scale", np.float32(p["scale"])),
                     const.array("zero_point", zero)], {}


def _dequantise(p, inputs, opset, const):
    """A per-tensor DequantizeLinear: its scale, and its zero point in its input's type."""
    return inputs + [const.array("scale", np.float32(p["scale"])),
                     const.scalar("zero_point", p["zero_point"])], {}


def _no_attributes(p, inputs, opset, const):
    """Ops whose canonical parameters are implied by the op (global pooling's axes)."""
    return inputs, {}


def same_in_every_opset(p, inputs, opset, const):
    """Ops whose canonical parameters are their attributes, named alike at every opset."""
    return inputs, dict(p)


def _never_canonical(p, inputs, opset, const):
    """BatchNormalization: the importer folds or rewrites each one (importer/batchnorm.py), and
    one it cannot is left as it was, so none is ever written from canonical parameters."""
    raise ValueError("a BatchNormalization has no canonical form to encode")


# The ops ``same_in_every_opset`` writes: those whose normaliser takes the schema's attributes
# (canonical.schema_attributes: the elementwise math, Cast, Identity, DepthToSpace,
# SpaceToDepth), and those whose parameters never moved to inputs (Concat's axis, Transpose's
# perm, Flatten's axis, Gemm's transposes; a canonical MatMul has none). Listed rather
# than a default: an op whose encoding changed at some opset must say so.
_ATTRIBUTE_OPS = (
    "Flatten Identity Concat Transpose DepthToSpace SpaceToDepth Cast MatMul Gemm MatMulInteger "
    "Abs Neg Not Relu Sigmoid Exp Log Sqrt Reciprocal IsNaN IsInf Floor Ceil Round Sign Sin Cos "
    "LeakyRelu HardSigmoid HardSwish Softsign ThresholdedRelu Shrink Swish Tanh Erf Tan Asin "
    "Acos Atan Sinh Cosh Asinh Acosh Atanh Elu Selu Celu Softplus Gelu Mish "
    "Add Mul Max Min Sum Mean Equal And Or Xor Sub Where Less Greater LessOrEqual "
    "GreaterOrEqual Div PRelu Pow Mod BitShift")

# Every op of the registry (registry/ops.py): its encoder, registered with the op.
# tests/test_op_registry.py checks that none is missing.
ENCODER = "encoder"
ENCODERS: Mapping[str, Callable] = register_table(ENCODER, {
    "Slice": _slice, "Pad": _pad, "Tile": _tile, "Expand": _expand, "Split": _split,
    "Squeeze": _axes, "Unsqueeze": _axes, "Reshape": _reshape, "Gather": _gather, "Clip": _clip,
    "Softmax": _softmax, "LogSoftmax": _softmax, "LayerNormalization": _layer_normalization,
    "InstanceNormalization": _instance_normalization, "GroupNormalization": _group_normalization,
    **{op: _reduce(op) for op in REDUCE_OPS}, **{op: _window for op in POOL_OPS}, "Conv": _conv,
    "ConvInteger": _conv, "QuantizeLinear": _quantise, "DequantizeLinear": _dequantise,
    **{op: _no_attributes for op in GLOBAL_POOL_OPS}, "BatchNormalization": _never_canonical,
    **{op: same_in_every_opset for op in _ATTRIBUTE_OPS.split()},
})
