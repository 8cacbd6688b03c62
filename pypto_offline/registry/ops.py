"""The op registry: one ``OpDef`` per ONNX op the compiler understands (default domain only).

Every stage reads what it needs of an op from here and nowhere else: the importer whether the op
is in scope and which inputs are data (the rest are parameters folded into canonical form),
fusion its kind (what a region may hold, which ops broadcast, which map element i to element i),
its view algebra and which of its input the outputs read, the cost model whether it is metadata
only, and the targets whether the kernel generator lowers it and in which precision (ask
``definition(op)``, not a set of names of your own). What a stage does with an op that no field
says (its normaliser, encoder, lowering...) the stage registers with the op
(``registry/attributes.py``); ``pypto-offline op NAME`` shows both.
TVM's op patterns (kElemWise, kBroadcast, kInjective, kCommReduce, kOutEWiseFusable, kOpaque)
are the model for the kinds; what each kind may share a region with is in docs/regions.md.

Adding an op: its ``OpDef`` in ``OPS`` below, then what no field says, registered with it
by its stage (the normaliser, the encoder, the lowering); docs/architecture.md, "Adding an op",
walks through each step on ReduceL1, and ``tests/test_op_registry.py`` fails on anything left
out.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from types import MappingProxyType
from typing import Collection

# Kinds, in TVM's order of how freely they fuse.
VIEW = "view"                # metadata only on contiguous data: no kernel, no bytes
ELEMENTWISE = "elementwise"  # one data input, output element i from input element i
BROADCAST = "broadcast"      # several data inputs, numpy broadcasting, then elementwise
INJECTIVE = "injective"      # moves elements (each output element is one input element)
REDUCTION = "reduction"      # reduces trailing axes, possibly with elementwise work around it
WINDOW = "window"            # each output element reduces a small window of inputs (pooling)
MATMUL = "matmul"            # a contraction: the root of a region, its epilogue fused after it
KINDS = (VIEW, ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, WINDOW, MATMUL)


# Which input elements an op's outputs read (``OpDef.reads``); the cost model's lower bound
# counts the elements some output needs (fusion/cost.py), so a reader of part of its input must
# say so: a count too high is no bound.
READS_ALL = "all"        # every element of every data input, when every output is wanted
READS_PART = "part"      # may leave some unread (a Slice, a Gather, a cropping Pad)
READS_WINDOW = "window"  # the elements its windows cover (a pooling whose windows skip the tail)
READS = (READS_ALL, READS_PART, READS_WINDOW)


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
    # Its two operands may be swapped (a variadic one's in any order): the generator puts the
    # operand it holds as a tile first, a comparison is its own mirror.
    commutative: bool = False
    # Computed in fp32 for an fp16 or bf16 input, cast back after (a polynomial, or a difference
    # of nearby values, loses digits in half precision); only an activations.py builder does.
    fp32_for_half: bool = False
    reads: str = READS_ALL      # which input elements its outputs read (READS)
    # A rewrite rule always writes it as other ops (fusion/rules.py), so the generator lowers
    # it without a lowering of its own
    decomposed: bool = False
    # Its index map as a view transform (fusion/views.TRANSFORMS): a data-movement op the view
    # algebra composes and proves no-op chains with. Reshape-likes other than Reshape have none:
    # a region's program holds them as one Reshape (fusion/program.py).
    view: str | None = None
    # Whether --precision_mode allow_mix_precision computes it in fp16 (ATC's ops-info key of
    # the same name, docs/precision.md): True, in fp16 (the cube's operands); False, in fp32
    # between casts inside its kernel (a sum, a mean, exp and log lose digits or overflow in
    # fp16); None, as its data inputs are (fp32 when any of them is).
    precision_reduce: bool | None = None
    # A reduction that gives a lone element back as it is (a sum, mean, max or min of one
    # element; not a sum of squares, an L1 or an L2 norm): over axes of one element, a reshape.
    as_is_over_one: bool = False

    @property
    def pointwise(self) -> bool:
        """Output element i depends on input element i only (inputs broadcast): elementwise
        and broadcasting ops, and the views that broadcast or keep their input (Expand,
        Identity)."""
        return self.kind in (ELEMENTWISE, BROADCAST) or self.view in ("expand", "identity")

    @property
    def view_only(self) -> bool:
        """Metadata only on contiguous data (a Reshape, Squeeze, Identity...): no bytes move."""
        return self.kind == VIEW

    @property
    def reshape_like(self) -> bool:
        """A view other than Identity (Reshape, Squeeze, Unsqueeze, Flatten): a region's
        program holds each as one Reshape (fusion/program.py)."""
        return self.kind == VIEW and self.view != "identity"

    @property
    def elementwise(self) -> bool:
        """Elementwise or broadcasting math (not a view that keeps or broadcasts its input)."""
        return self.kind in (ELEMENTWISE, BROADCAST)

    @property
    def convolution(self) -> bool:
        """A Conv or a quantised one (ConvInteger), alike in their attributes."""
        return self.name in CONV_OPS

    @property
    def projection(self) -> bool:
        """A MatMul or a Gemm: a float product of matrices (not a convolution's, not an
        integer one), a projection where its right operand is weights."""
        return self.kind == MATMUL and not self.convolution \
            and self.name not in INTEGER_CONTRACTIONS

    @property
    def row_result(self) -> bool:
        """A reduction whose result keeps one element per row (a Reduce* op, a global pooling);
        the other reductions normalise the rows (Softmax, LayerNormalization...)."""
        return self.name in ROW_RESULT_OPS

    @property
    def per_row_parameters(self) -> bool:
        """A normalisation whose scale and bias apply per row (a channel's, or a group's, of one
        image) rather than per column (LayerNormalization's)."""
        return self.name in PER_ROW_PARAMETER_OPS

    @property
    def flat(self) -> bool:
        """Element i of its input is element i of its output in flat (row-major) order, where
        both have as many elements: the elementwise ops, and the views that keep the order
        (a Reshape, but not an Expand, which adds elements). What may run on a region's
        elements laid out in rows of any length (codegen's flat rows)."""
        return self.kind in (ELEMENTWISE, BROADCAST, VIEW)


def _defs(kind: str, names: str, lowered: str = "", **fields) -> dict[str, OpDef]:
    """OpDefs of one kind and the same ``fields``; those in ``lowered`` lower."""
    lowered_names = set(lowered.split())
    return {name: OpDef(name, kind, lowers=name in lowered_names, **fields)
            for name in names.split()}


def _views(kind: str, names_and_transforms: str, **fields) -> dict[str, OpDef]:
    """Lowered ops of ``kind`` whose index map is a view transform: ``"Name:transform ..."``."""
    pairs = (item.split(":") for item in names_and_transforms.split())
    return {name: OpDef(name, kind, lowers=True, view=view, **fields) for name, view in pairs}


_REDUCE_AS_IS = "ReduceSum ReduceMean ReduceMax ReduceMin"
# ... and those that reduce a function of each element (its square, its absolute value): over
# one element, that function of it, not the element
_REDUCE_OF_EACH = "ReduceSumSquare ReduceL2 ReduceL1"
_REDUCE = f"{_REDUCE_AS_IS} {_REDUCE_OF_EACH}"
_GLOBAL_POOLS = "GlobalAveragePool GlobalMaxPool"
_POOLS = "MaxPool AveragePool"
# Float math PyPTO has a call for, or that its builder composes in the input's precision
_FLOAT_MATH = ("Relu Sigmoid Sqrt Reciprocal IsNaN IsInf Floor Ceil Round Sign Sin Cos "
               "LeakyRelu HardSigmoid HardSwish Softsign ThresholdedRelu Shrink Swish")
# ... and the compositions that lose digits in half precision (pypto_kernels/activations.py)
_FP32_MATH = ("Tanh Erf Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Elu Selu Celu Softplus "
              "Gelu Mish")
_COMMUTATIVE = "Add Mul Max Min Sum Mean Equal And Or Xor"
_ORDERED = "Sub Where Less Greater LessOrEqual GreaterOrEqual"
_NORMALISATIONS = ("Softmax LogSoftmax LayerNormalization InstanceNormalization "
                   "GroupNormalization")
OPS: MappingProxyType = MappingProxyType({
    **_views(VIEW, "Reshape:reshape", data_inputs=1),
    **_defs(VIEW, "Squeeze Unsqueeze Flatten", "Squeeze Unsqueeze Flatten", data_inputs=1),
    **_views(VIEW, "Identity:identity"),
    **_views(INJECTIVE, "Slice:slice Pad:pad", data_inputs=1, reads=READS_PART),
    **_views(INJECTIVE, "Expand:expand", data_inputs=1),
    **_defs(INJECTIVE, "Tile Split", "Tile Split", data_inputs=1),
    **_defs(INJECTIVE, "Gather", "Gather", data_inputs=1, reads=READS_PART),
    **_defs(INJECTIVE, "Concat", "Concat"),
    **_views(INJECTIVE, "Transpose:permute", reorders=True),
    # Both permutations of their input: every element read
    **_defs(INJECTIVE, "DepthToSpace SpaceToDepth", "DepthToSpace SpaceToDepth", reorders=True),
    **_defs(ELEMENTWISE, "Cast", "Cast"),
    **_defs(ELEMENTWISE, "Clip", "Clip", data_inputs=1),
    # PyPTO's abs and neg take integers too; logical_not takes bools
    **_defs(ELEMENTWISE, "Abs Neg Not", "Abs Neg Not"),
    # Float math: PyPTO calls, or compositions of them (pypto_kernels/activations.py)
    **_defs(ELEMENTWISE, _FLOAT_MATH, _FLOAT_MATH, floats_only=True),
    # exp overflows fp16 past 11.1 and log's argument often comes from a sum: fp32 when mixed
    **_defs(ELEMENTWISE, "Exp Log", "Exp Log", floats_only=True, precision_reduce=False),
    **_defs(ELEMENTWISE, _FP32_MATH, _FP32_MATH, floats_only=True, fp32_for_half=True),
    **_defs(BROADCAST, _COMMUTATIVE, _COMMUTATIVE, commutative=True),
    **_defs(BROADCAST, _ORDERED, _ORDERED),
    # PyPTO 0.2.0's div does not compile for integers (DIVOpError); Pow's exponent is a data
    # input like the base (a constant scalar one is written as multiplications where it can)
    **_defs(BROADCAST, "Div PRelu", "Div PRelu", floats_only=True),
    # x ** 2 of an activation past 256 overflows fp16 (a T5 RMSNorm's squares): fp32 when mixed
    **_defs(BROADCAST, "Pow", "Pow", floats_only=True, precision_reduce=False),
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
    # Every reduction sums (or compares) many elements: fp32 when mixed
    **_defs(REDUCTION, _REDUCE_OF_EACH, _REDUCE_OF_EACH, data_inputs=1, precision_reduce=False),
    **_defs(REDUCTION, _REDUCE_AS_IS, _REDUCE_AS_IS, data_inputs=1, as_is_over_one=True,
            precision_reduce=False),
    **_defs(REDUCTION, _NORMALISATIONS, _NORMALISATIONS, precision_reduce=False),
    # Pooling over small windows: a rewrite rule writes it as the window's shifted views and
    # their Max or Mean (fusion/rules.pool_as_window_views), so it goes where they go
    **_defs(WINDOW, _POOLS, _POOLS, reads=READS_WINDOW, decomposed=True),
    # Global pooling is a reduction over the spatial axes (a squeeze-and-excite's mean)
    **_defs(REDUCTION, _GLOBAL_POOLS, _GLOBAL_POOLS, precision_reduce=False),
    # Matrices (equal batch axes, or a 2-D right operand) and 1x1 convolutions (the weights
    # times the pixels; no other convolution is canonical): compute-bound, so a kernel of its
    # own unless its elementwise epilogue joins it (TVM's kOutEWiseFusable, IREE's root op).
    # The cube takes fp16 operands (and accumulates in L0C, fp32 on the 910B's DAV_2201).
    **_defs(MATMUL, "MatMul Gemm Conv", "MatMul Gemm Conv", precision_reduce=True),
    # A QDQ model's quantised contractions (importer/quantised.py): int8 operands, an int32
    # product the epilogue dequantises; no precision mode converts them (docs/int8.md)
    **_defs(MATMUL, "MatMulInteger ConvInteger", "MatMulInteger ConvInteger"),
    # An activation's quantisation, per tensor: a DQ reads int8 (1 byte an element across GM)
    # and computes in float; a Q rounds half to even and saturates (docs/int8.md)
    **_defs(ELEMENTWISE, "DequantizeLinear", "DequantizeLinear", data_inputs=1),
    **_defs(ELEMENTWISE, "QuantizeLinear", "QuantizeLinear", data_inputs=1, floats_only=True),
})
# Ops only rewrite rules create inside a region's program (fusion/rules.py), never imported:
# no ONNX op (a Roll is x[k:] then x[:k], concatenated: fusion/lower.py)
PROGRAM_ONLY_OPS = frozenset({"Roll"})
# The convolutions: a Conv, and a quantised one (ConvInteger), alike in their attributes
CONV_OPS = frozenset({"Conv", "ConvInteger"})


def matmul_extents(op_type: str, out_shape, right_rank: int) -> tuple[int, int]:
    """The rows and columns (M, N) of the product a matmul-kind op computes, as the kernel
    generator writes it: a 1x1 Conv as ``W[Cout, Cin] @ x[Cin, H*W]``, a 2-D right operand with
    the left operand's leading axes folded into M, else a batch of ``out[-2:]`` matrices."""
    if op_type in CONV_OPS:
        return out_shape[1], out_shape[2] * out_shape[3]
    if right_rank == 2:
        return prod(out_shape[:-1]), out_shape[-1]
    return out_shape[-2], out_shape[-1]


def contraction_shape(op_type: str, left, right, out) -> tuple[int, int, int, int]:
    """(M, N, K, slices) of the products a matmul-kind op computes, as the kernel generator
    writes them (its operands' and output's shapes): a Conv as ``W[Cout, Cin·kh·kw] @
    columns[Cin·kh·kw, Ho·Wo]``, its weights the left factor; a 2-D right operand with the left
    operand's leading axes folded into M; else one 2-D product per slice of the batch axes."""
    if op_type in CONV_OPS:
        return (*matmul_extents(op_type, out, 2), left[1] * prod(right[2:]), 1)
    if len(right) == 2:
        return (*matmul_extents(op_type, out, 2), left[-1], 1)
    return out[-2], out[-1], left[-1], prod(out[:-2])


def stride_one_span(shape, strides) -> list[int]:
    """The rows and columns an NCHW output ``shape`` strided by ``strides`` spans in its input
    at stride 1: what a window's tap reads before every stride-th row and column is taken."""
    return [*shape[:2], *((extent - 1) * stride + 1 for extent, stride in zip(shape[2:], strides))]


# The domains of ONNX's own ops; the registry defines those only
ONNX_DOMAINS = ("", "ai.onnx")


@lru_cache(maxsize=None)
def _split(names: str) -> frozenset[str]:
    return frozenset(names.split())


def op_names(op_types: str | Collection[str]) -> Collection[str]:
    """Op names given as one string (names separated by spaces) or as a collection."""
    return _split(op_types) if isinstance(op_types, str) else op_types


def is_op(node, op_types: str | Collection[str]) -> bool:
    """Whether ``node`` (an ONNX NodeProto, an imported node, a region's program op) is one of
    ``op_types`` (``op_names``) of ONNX's own domain: what a pattern asks of an op it names. A
    program op has no domain: it is ONNX's or the program's (``PROGRAM_ONLY_OPS``)."""
    return node.op_type in op_names(op_types) and getattr(node, "domain", "") in ONNX_DOMAINS


# What ``definition`` gives for an op the registry lacks: of no kind, every property false
UNKNOWN = OpDef("", "")


def definition(op_type: str, domain: str = "") -> OpDef:
    """The op's entry, or ``UNKNOWN``: what a stage asks of an op it may not know (a program's
    Roll, a node of another domain)."""
    return op_def(op_type, domain) or UNKNOWN


def op_def(op_type: str, domain: str = "") -> OpDef | None:
    return OPS.get(op_type) if domain in ONNX_DOMAINS else None


def in_scope(op_type: str, domain: str = "") -> bool:
    return op_def(op_type, domain) is not None


def is_depthwise_conv(op_type: str, params) -> bool:
    """A canonical Conv of a group per channel, one filter each (importer/contractions._conv,
    which records ``depthwise``): a window op."""
    return op_type in CONV_OPS and bool((params or {}).get("depthwise"))


def is_cube_conv(op_type: str, params) -> bool:
    """A canonical Conv the cube computes as ``W[Cout, Cin·kh·kw] @ columns[Cin·kh·kw, Ho·Wo]``:
    a 1x1 one (no parameters: the columns are the image), or any other that is not depthwise
    (a grouped one with block-diagonal weights)."""
    return op_type in CONV_OPS and not is_depthwise_conv(op_type, params)


def kind_of(op_type: str, params=None) -> str | None:
    """The op's kind; with its canonical ``params``, a depthwise Conv's is a window's: each
    output element a weighted sum of a small window of its own channel, which the kernel
    writes as the window's taps (pypto_kernels/codegen/convolution.py). Without them, a Conv is
    a matmul (what the cube computes, for the precision modes and the baseline)."""
    if is_depthwise_conv(op_type, params):
        return WINDOW
    definition = OPS.get(op_type)
    return definition.kind if definition else None


def reads_of(op_type: str, params=None) -> str:
    """Which input elements the op's outputs read (``OpDef.reads``); a depthwise Conv reads
    its windows. An op the registry lacks reads part, to keep the cost model's bound a bound."""
    if is_depthwise_conv(op_type, params):
        return READS_WINDOW
    definition = OPS.get(op_type)
    return definition.reads if definition is not None else READS_PART


def names(*kinds: str) -> frozenset[str]:
    return frozenset(name for name, d in OPS.items() if d.kind in kinds)


def data_inputs(op_type: str, inputs) -> list[str]:
    """The data inputs of a node of this op (its parameters excluded)."""
    definition = OPS.get(op_type)
    count = definition.data_inputs if definition else None
    return list(inputs) if count is None else list(inputs[:count])


def marked(field: str) -> frozenset[str]:
    """The ops whose entry's ``field`` (or property) is true."""
    return frozenset(name for name, d in OPS.items() if getattr(d, field))


def lowered_ops() -> frozenset[str]:
    return marked("lowers")


ELEMENTWISE_OPS = names(ELEMENTWISE, BROADCAST)
REDUCE_OPS = frozenset(_REDUCE.split())  # the Reduce* ops: axes and keepdims
POOL_OPS = frozenset(_POOLS.split())
GLOBAL_POOL_OPS = frozenset(_GLOBAL_POOLS.split())  # over every axis after N and C, kept
ROW_RESULT_OPS = REDUCE_OPS | GLOBAL_POOL_OPS  # OpDef.row_result
# A QDQ model's (de)quantisations, and its contractions on integer operands whose output is
# their int32 accumulator (docs/int8.md)
QUANTISATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
INTEGER_CONTRACTIONS = frozenset({"MatMulInteger", "ConvInteger"})
PER_ROW_PARAMETER_OPS = frozenset({"InstanceNormalization", "GroupNormalization"})
BROADCASTING_OPS = names(BROADCAST)
POINTWISE_OPS = marked("pointwise")
VIEW_TRANSFORM_OPS = marked("view")  # fusion/views.py
DECOMPOSED_OPS = marked("decomposed")  # a rewrite rule writes them as others (fusion/rules.py)
