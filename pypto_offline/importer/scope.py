"""Which ONNX ops the compiler understands (default domain only).

Data-movement ops change where elements sit; elementwise ops compute per element. Both are
memory-bound and may be fused; everything else passes through the importer untouched and is a
boundary for fusion.
"""
from __future__ import annotations

DATA_MOVEMENT_OPS = frozenset({
    "Slice", "Pad", "Tile", "Expand", "Concat", "Split", "Squeeze", "Unsqueeze", "Reshape",
    "Flatten", "Transpose", "Gather", "DepthToSpace", "SpaceToDepth", "Cast", "Identity",
})

ELEMENTWISE_OPS = frozenset({
    # unary
    "Abs", "Neg", "Relu", "Sigmoid", "Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Erf", "Floor",
    "Ceil", "Round", "Sign", "Sin", "Cos", "Not", "IsNaN", "IsInf", "LeakyRelu", "Elu", "Selu",
    "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Mish",
    "ThresholdedRelu", "Shrink", "Swish",
    # binary and variadic, with numpy broadcasting
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu", "BitShift",
    # ternary
    "Where", "Clip",
})

IN_SCOPE_OPS = DATA_MOVEMENT_OPS | ELEMENTWISE_OPS


def in_scope(op_type: str, domain: str) -> bool:
    return domain in ("", "ai.onnx") and op_type in IN_SCOPE_OPS
