"""The op registry: one ``OpDef`` per ONNX op the compiler understands (default domain only).

Every stage reads what it needs of an op from here and nowhere else: the importer whether the op
is in scope and which inputs are data (the rest are parameters folded into canonical form),
fusion its kind (what a region may hold, which ops broadcast, which map element i to element i),
the cost model whether it is metadata only, and the targets whether the kernel generator lowers
it (``lowers``; ``tests/test_op_registry.py`` checks that every op marked so has a lowering in
``pypto_kernels/codegen.py`` and no other op has one). Adding an op is one entry here, its
normaliser in ``importer/canonical.py`` if it has parameters, and its lowering. TVM's op
patterns (kElemWise, kBroadcast, kInjective, kCommReduce, kOutEWiseFusable, kOpaque) are the
model for the kinds; what each kind may share a region with is in docs/regions.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from types import MappingProxyType

# Kinds, in TVM's order of how freely they fuse.
VIEW = "view"                # metadata only on contiguous data: no kernel, no bytes
ELEMENTWISE = "elementwise"  # one data input, output element i from input element i
BROADCAST = "broadcast"      # several data inputs, numpy broadcasting, then elementwise
INJECTIVE = "injective"      # moves elements (each output element is one input element)
REDUCTION = "reduction"      # reduces trailing axes, possibly with elementwise work around it
WINDOW = "window"            # each output element reduces a small window of inputs (pooling)
MATMUL = "matmul"            # a contraction: the root of a region, its epilogue fused after it
KINDS = (VIEW, ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, WINDOW, MATMUL)


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    # How many leading inputs are data; None: all of them. The others are parameters, known at
    # compile time and folded into the canonical form.
    data_inputs: int | None = None
    lowers: bool = False        # the kernel generator writes PyPTO for it
    reorders: bool = False      # walks its output in another axis order than its input
    floats_only: bool = False   # its lowering computes in floating point (fp32, fp16, bf16)
    why_not: str = ""           # why it has no lowering, where that is known

    @property
    def pointwise(self) -> bool:
        """Output element i depends on input element i only (inputs broadcast)."""
        return self.kind in (ELEMENTWISE, BROADCAST) or self.name in ("Expand", "Identity")


def _defs(kind: str, names: str, lowered: str = "", **fields) -> dict[str, OpDef]:
    """OpDefs of one kind and the same ``fields``; those in ``lowered`` lower."""
    lowered_names = set(lowered.split())
    return {name: OpDef(name, kind, lowers=name in lowered_names, **fields)
            for name in names.split()}


_REDUCE = "ReduceSum ReduceMean ReduceMax ReduceMin ReduceSumSquare ReduceL2"
_GLOBAL_POOLS = "GlobalAveragePool GlobalMaxPool"
_POOLS = "MaxPool AveragePool"
_FLOAT_MATH = ("Tanh Erf Floor Ceil Round Sign Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh "
               "Atanh LeakyRelu Elu Selu Celu HardSigmoid HardSwish Softplus Softsign Gelu Mish "
               "ThresholdedRelu Shrink Swish")
_NORMALISATIONS = ("Softmax LogSoftmax LayerNormalization InstanceNormalization "
                   "GroupNormalization")
OPS: MappingProxyType = MappingProxyType({
    **_defs(VIEW, "Reshape Squeeze Unsqueeze Flatten", "Reshape Squeeze Unsqueeze Flatten",
            data_inputs=1),
    **_defs(VIEW, "Identity", "Identity"),
    **_defs(INJECTIVE, "Slice Pad Tile Expand Split Gather", "Slice Pad Tile Expand Split Gather",
            data_inputs=1),
    **_defs(INJECTIVE, "Concat", "Concat"),
    **_defs(INJECTIVE, "Transpose DepthToSpace SpaceToDepth", "Transpose DepthToSpace SpaceToDepth",
            reorders=True),
    **_defs(ELEMENTWISE, "Cast", "Cast"),
    **_defs(ELEMENTWISE, "Clip", "Clip", data_inputs=1),
    # PyPTO's abs and neg take integers too; logical_not takes bools
    **_defs(ELEMENTWISE, "Abs Neg Not", "Abs Neg Not"),
    # Float math: PyPTO calls, or compositions of them (pypto_kernels/activations.py)
    **_defs(ELEMENTWISE, "Relu Sigmoid Exp Log Sqrt Reciprocal IsNaN IsInf " + _FLOAT_MATH,
            "Relu Sigmoid Exp Log Sqrt Reciprocal IsNaN IsInf " + _FLOAT_MATH, floats_only=True),
    **_defs(BROADCAST, "Add Sub Mul Max Min Sum Mean Where Equal Less Greater LessOrEqual "
                       "GreaterOrEqual And Or Xor",
            "Add Sub Mul Max Min Sum Mean Where Equal Less Greater LessOrEqual GreaterOrEqual "
            "And Or Xor"),
    # PyPTO 0.2.0's div does not compile for integers (DIVOpError); Pow's exponent is a data
    # input like the base (a constant scalar one is written as multiplications where it can)
    **_defs(BROADCAST, "Div PRelu Pow", "Div PRelu Pow", floats_only=True),
    **_defs(BROADCAST, "Mod", why_not="PyPTO 0.2.0's fmod and remainder do not compile (F92001, "
                                      "nor its integer div: DIVOpError), and a - trunc(a / b) * b "
                                      "in floating point is not exact"),
    **_defs(BROADCAST, "BitShift", why_not="PyPTO 0.2.0's bitwise shifts do not compile for any "
                                           "integer type (F92001, 'Inputs datatype not "
                                           "supported')"),
    # At inference a per-channel scale and shift: the importer folds it into the weights before
    # it or writes it as Mul and Add (importer/batchnorm.py); one left is not canonical
    **_defs(ELEMENTWISE, "BatchNormalization", data_inputs=1),
    # Reductions over trailing axes (their canonical form makes the axes explicit); Softmax,
    # LogSoftmax and the normalisations are reductions with elementwise work around them.
    **_defs(REDUCTION, _REDUCE, _REDUCE, data_inputs=1),
    **_defs(REDUCTION, _NORMALISATIONS, _NORMALISATIONS),
    # Pooling over small windows: a rewrite rule writes it as the window's shifted views and
    # their Max or Mean (fusion/rules.pool_as_window_views), so it goes where they go
    **_defs(WINDOW, _POOLS, _POOLS),
    # Global pooling is a reduction over the spatial axes (a squeeze-and-excite's mean)
    **_defs(REDUCTION, _GLOBAL_POOLS, _GLOBAL_POOLS),
    # Matrices (equal batch axes, or a 2-D right operand) and 1x1 convolutions (the weights
    # times the pixels; no other convolution is canonical): compute-bound, so a kernel of its
    # own unless its elementwise epilogue joins it (TVM's kOutEWiseFusable, IREE's root op).
    **_defs(MATMUL, "MatMul Gemm Conv", "MatMul Gemm Conv"),
})


def matmul_extents(op_type: str, out_shape, right_rank: int) -> tuple[int, int]:
    """The rows and columns (M, N) of the product a matmul-kind op computes, as the kernel
    generator writes it: a 1x1 Conv as ``W[Cout, Cin] @ x[Cin, H*W]``, a 2-D right operand with
    the left operand's leading axes folded into M, else a batch of ``out[-2:]`` matrices."""
    if op_type == "Conv":
        return out_shape[1], out_shape[2] * out_shape[3]
    if right_rank == 2:
        return prod(out_shape[:-1]), out_shape[-1]
    return out_shape[-2], out_shape[-1]


def op_def(op_type: str, domain: str = "") -> OpDef | None:
    return OPS.get(op_type) if domain in ("", "ai.onnx") else None


def in_scope(op_type: str, domain: str = "") -> bool:
    return op_def(op_type, domain) is not None


def kind_of(op_type: str) -> str | None:
    definition = OPS.get(op_type)
    return definition.kind if definition else None


def names(*kinds: str) -> frozenset[str]:
    return frozenset(name for name, d in OPS.items() if d.kind in kinds)


def data_inputs(op_type: str, inputs) -> list[str]:
    """The data inputs of a node of this op (its parameters excluded)."""
    definition = OPS.get(op_type)
    count = definition.data_inputs if definition else None
    return list(inputs) if count is None else list(inputs[:count])


def lowered_ops() -> frozenset[str]:
    return frozenset(name for name, d in OPS.items() if d.lowers)


VIEW_ONLY_OPS = names(VIEW)
ELEMENTWISE_OPS = names(ELEMENTWISE, BROADCAST)
REDUCTION_OPS = names(REDUCTION)
MATMUL_OPS = names(MATMUL)
REDUCE_OPS = frozenset(_REDUCE.split())  # the Reduce* ops: axes and keepdims
POOL_OPS = frozenset(_POOLS.split())
GLOBAL_POOL_OPS = frozenset(_GLOBAL_POOLS.split())  # over every axis after N and C, kept
# Reductions whose result keeps one element per row (the others normalise the rows)
ROW_RESULT_OPS = REDUCE_OPS | GLOBAL_POOL_OPS
# Normalisations whose scale and bias apply per row (a channel's, or a group's, of one image)
# rather than per column (LayerNormalization's)
PER_ROW_PARAMETER_OPS = frozenset({"InstanceNormalization", "GroupNormalization"})
BROADCASTING_OPS = names(BROADCAST)
POINTWISE_OPS = frozenset(name for name, d in OPS.items() if d.pointwise)
