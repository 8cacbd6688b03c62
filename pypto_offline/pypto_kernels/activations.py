"""ONNX's elementwise math as PyPTO 0.2.0 expressions: one builder per op.

PyPTO 0.2.0 has sin, cos, floor, ceil, round (half to even, as ONNX's Round), exp, expm1, log,
log1p, sqrt, rsqrt, pow, abs, relu, sigmoid and the comparisons, each checked in fp32 and fp16
through its interpreter; it has no tanh, erf, atan, sign that interprets (``pypto.sign``
compiles but its interpreter fails), nor a working fmod, cbrt or exp2 (they do not compile in
SIM). Every other ONNX activation is a composition of what it has (docs/pypto-ops.md,
"Activations"). A builder takes the op's input as a variable name and returns the expression of
its output; temporaries it needs are emitted through ``Math.let``.

The builders of the ops the registry marks ``fp32_for_half`` compute in fp32
whatever the input's precision (a polynomial, or a difference of nearby values, loses digits in
fp16); the others run in the input's precision.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pypto_offline.registry.attributes import register_table

# Abramowitz and Stegun 7.1.26: erf(x) = 1 - t*(a1 + t*(a2 + ... + t*a5)) * exp(-x*x) for
# x >= 0, t = 1 / (1 + p*x); absolute error below 1.5e-7.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# Cephes' atanf: after reduction to |z| <= tan(pi/8), atan(z) = z + z^3 * P(z^2); relative
# error about 1e-7 in fp32.
ATAN_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
TAN_3PI_8, TAN_PI_8 = 2.414213562373095, 0.41421356237309503
SQRT_HALF, SQRT_2_OVER_PI = math.sqrt(0.5), math.sqrt(2 / math.pi)


def literal(value) -> str:
    """Python source for a float, infinities and NaN included (``repr`` gives a bare ``inf``)."""
    value = float(value)
    return repr(value) if math.isfinite(value) else f'float("{value}")'


@dataclass(frozen=True)
class Math:
    """What a builder may use: ``let`` emits a temporary and returns its name; ``full`` is a
    tile of the op's shape holding ``value`` in the computing precision; ``params`` are the
    op's canonical parameters."""

    let: Callable[[str], str]
    full: Callable[[float], str]
    params: Mapping[str, Any]

    def param(self, name: str, default: float) -> float:
        value = self.params.get(name)
        return float(default if value is None else value)


Builder = Callable[[Math, str], str]


def _where_negative(m: Math, x: str, negative: str, otherwise: str) -> str:
    return f"pypto.where(pypto.lt({x}, 0.0), {negative}, {otherwise})"


def _odd(m: Math, x: str, of_magnitude: Callable[[str], str]) -> str:
    """f(x) for an odd f, from f(|x|): the sign restored with a ``where``."""
    positive = m.let(of_magnitude(m.let(f"pypto.abs({x})")))
    return _where_negative(m, x, f"pypto.neg({positive})", positive)


def erf(m: Math, x: str) -> str:
    def of_magnitude(a: str) -> str:
        t = m.let(f"pypto.div({m.full(1.0)}, pypto.add(pypto.mul({a}, {literal(ERF_P)}), 1.0))")
        poly = m.let(f"pypto.mul({t}, {literal(ERF_A[-1])})")
        for coefficient in reversed(ERF_A[:-1]):
            poly = m.let(f"pypto.mul(pypto.add({poly}, {literal(coefficient)}), {t})")
        return (f"pypto.add(pypto.neg(pypto.mul({poly}, pypto.exp(pypto.neg(pypto.mul({a}, "
                f"{a}))))), 1.0)")
    return _odd(m, x, of_magnitude)


def tanh(m: Math, x: str) -> str:
    """1 - 2 / (exp(2x) + 1): exp's overflow to inf for a large x gives 1 and its underflow to
    0 gives -1, both exact."""
    return (f"pypto.add(pypto.neg(pypto.div({m.full(2.0)}, pypto.add(pypto.exp(pypto.mul({x}, "
            f"2.0)), 1.0))), 1.0)")


def atan(m: Math, x: str) -> str:
    def of_magnitude(a: str) -> str:
        big, mid = (m.let(f"pypto.gt({a}, {literal(bound)})") for bound in (TAN_3PI_8, TAN_PI_8))
        z = m.let(f"pypto.where({big}, pypto.neg(pypto.div({m.full(1.0)}, {a})), pypto.where("
                  f"{mid}, pypto.div(pypto.add({a}, -1.0), pypto.add({a}, 1.0)), {a}))")
        offset = (f"pypto.where({big}, {m.full(math.pi / 2)}, pypto.where({mid}, "
                  f"{m.full(math.pi / 4)}, {m.full(0.0)}))")
        square = m.let(f"pypto.mul({z}, {z})")
        poly = m.let(f"pypto.mul({square}, {literal(ATAN_P[0])})")
        for coefficient in ATAN_P[1:]:
            poly = m.let(f"pypto.mul(pypto.add({poly}, {literal(coefficient)}), {square})")
        return f"pypto.add(pypto.add(pypto.mul({poly}, {z}), {z}), {offset})"
    return _odd(m, x, of_magnitude)


def asin(m: Math, x: str) -> str:
    """atan(x / sqrt((1 - x)(1 + x))): +-pi/2 at +-1 (x / 0 is inf), NaN beyond."""
    root = f"pypto.sqrt(pypto.mul(pypto.add(pypto.neg({x}), 1.0), pypto.add({x}, 1.0)))"
    return atan(m, m.let(f"pypto.div({x}, {root})"))


def acos(m: Math, x: str) -> str:
    """2 atan(sqrt((1 - x) / (1 + x))): 0 at 1, pi at -1."""
    ratio = f"pypto.div(pypto.add(pypto.neg({x}), 1.0), pypto.add({x}, 1.0))"
    return f"pypto.mul({atan(m, m.let(f'pypto.sqrt({ratio})'))}, 2.0)"


def asinh(m: Math, x: str) -> str:
    """log1p(a + a^2 / (1 + sqrt(a^2 + 1))) for a = |x|, without the cancellation of
    log(x + sqrt(x^2 + 1)) near 0 or for negative x."""
    def of_magnitude(a: str) -> str:
        square = m.let(f"pypto.mul({a}, {a})")
        return (f"pypto.log1p(pypto.add({a}, pypto.div({square}, pypto.add(pypto.sqrt("
                f"pypto.add({square}, 1.0)), 1.0))))")
    return _odd(m, x, of_magnitude)


def acosh(m: Math, x: str) -> str:
    """log1p(t + sqrt(t (t + 2))) for t = x - 1: exact near 1."""
    t = m.let(f"pypto.add({x}, -1.0)")
    return f"pypto.log1p(pypto.add({t}, pypto.sqrt(pypto.mul({t}, pypto.add({t}, 2.0)))))"


def atanh(m: Math, x: str) -> str:
    return f"pypto.mul(pypto.sub(pypto.log1p({x}), pypto.log1p(pypto.neg({x}))), 0.5)"


def sinh(m: Math, x: str) -> str:
    return f"pypto.mul(pypto.sub(pypto.expm1({x}), pypto.expm1(pypto.neg({x}))), 0.5)"


def cosh(m: Math, x: str) -> str:
    return f"pypto.mul(pypto.add(pypto.exp({x}), pypto.exp(pypto.neg({x}))), 0.5)"


def tan(m: Math, x: str) -> str:
    return f"pypto.div(pypto.sin({x}), pypto.cos({x}))"


def sign(m: Math, x: str) -> str:
    return (f"pypto.where(pypto.gt({x}, 0.0), {m.full(1.0)}, pypto.where(pypto.lt({x}, 0.0), "
            f"{m.full(-1.0)}, {m.full(0.0)}))")


def softplus(m: Math, x: str) -> str:
    """relu(x) + log1p(exp(-|x|)): log(1 + exp(x)) without exp's overflow."""
    return f"pypto.add(pypto.relu({x}), pypto.log1p(pypto.exp(pypto.neg(pypto.abs({x})))))"


def softsign(m: Math, x: str) -> str:
    return f"pypto.div({x}, pypto.add(pypto.abs({x}), 1.0))"


def mish(m: Math, x: str) -> str:
    return f"pypto.mul({x}, {tanh(m, m.let(softplus(m, x)))})"


def elu(m: Math, x: str) -> str:
    alpha = literal(m.param("alpha", 1.0))
    return _where_negative(m, x, f"pypto.mul(pypto.expm1({x}), {alpha})", x)


def selu(m: Math, x: str) -> str:
    alpha, gamma = m.param("alpha", 1.67326319217681884765625), m.param("gamma",
                                                                         1.05070102214813232421875)
    return (f"pypto.where(pypto.gt({x}, 0.0), pypto.mul({x}, {literal(gamma)}), "
            f"pypto.mul(pypto.expm1({x}), {literal(alpha * gamma)}))")


def celu(m: Math, x: str) -> str:
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    alpha = m.param("alpha", 1.0)
    negative = f"pypto.mul(pypto.expm1(pypto.mul({x}, {literal(1 / alpha)})), {literal(alpha)})"
    return f"pypto.add(pypto.relu({x}), pypto.minimum({negative}, 0.0))"


def leaky_relu(m: Math, x: str) -> str:
    return _where_negative(m, x, f"pypto.mul({x}, {literal(m.param('alpha', 0.01))})", x)


def thresholded_relu(m: Math, x: str) -> str:
    return f"pypto.where(pypto.gt({x}, {literal(m.param('alpha', 1.0))}), {x}, {m.full(0.0)})"


def shrink(m: Math, x: str) -> str:
    bias, lambd = m.param("bias", 0.0), m.param("lambd", 0.5)
    return (f"pypto.where(pypto.lt({x}, {literal(-lambd)}), pypto.add({x}, {literal(bias)}), "
            f"pypto.where(pypto.gt({x}, {literal(lambd)}), pypto.add({x}, {literal(-bias)}), "
            f"{m.full(0.0)}))")


def hard_sigmoid(m: Math, x: str) -> str:
    """max(0, min(1, alpha * x + beta))."""
    alpha, beta = m.param("alpha", 0.2), m.param("beta", 0.5)
    return f"pypto.clip(pypto.add(pypto.mul({x}, {literal(alpha)}), {literal(beta)}), 0.0, 1.0)"


def hard_swish(m: Math, x: str) -> str:
    """x * HardSigmoid(x) with alpha 1/6, beta 1/2: x * clip(x + 3, 0, 6) / 6."""
    gate = hard_sigmoid(Math(m.let, m.full, {"alpha": 1 / 6, "beta": 0.5}), x)
    return f"pypto.mul({x}, {gate})"


def gelu(m: Math, x: str) -> str:
    """Opset 20's Gelu: 0.5 x (1 + erf(x / sqrt 2)), or with ``approximate`` "tanh" the
    tanh form 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    if m.params.get("approximate", "none") == "tanh":
        inner = m.let(f"pypto.mul(pypto.add({x}, pypto.mul(pypto.mul(pypto.mul({x}, {x}), {x}), "
                      f"0.044715)), {literal(SQRT_2_OVER_PI)})")
        gate = tanh(m, inner)
    else:
        gate = erf(m, m.let(f"pypto.mul({x}, {literal(SQRT_HALF)})"))
    return f"pypto.mul(pypto.mul({x}, pypto.add({m.let(gate)}, 1.0)), 0.5)"


def swish(m: Math, x: str) -> str:
    return f"pypto.mul({x}, pypto.sigmoid(pypto.mul({x}, {literal(m.param('alpha', 1.0))})))"


def _call(function: str) -> Builder:
    return lambda m, x: f"pypto.{function}({x})"


# Each activation's builder, registered with the op (registry/attributes.py)
BUILDER = "activation_builder"
BUILDERS: Mapping[str, Builder] = register_table(BUILDER, {
    **{op: _call(function) for op, function in (
        ("Sin", "sin"), ("Cos", "cos"), ("Floor", "floor"), ("Ceil", "ceil"),
        ("Round", "round"))},
    "Erf": erf, "Tanh": tanh, "Tan": tan, "Atan": atan, "Asin": asin, "Acos": acos,
    "Sinh": sinh, "Cosh": cosh, "Asinh": asinh, "Acosh": acosh, "Atanh": atanh, "Sign": sign,
    "Softplus": softplus, "Softsign": softsign, "Mish": mish, "Elu": elu, "Selu": selu,
    "Celu": celu, "LeakyRelu": leaky_relu, "ThresholdedRelu": thresholded_relu,
    "Shrink": shrink, "HardSigmoid": hard_sigmoid, "HardSwish": hard_swish, "Gelu": gelu,
    "Swish": swish,
})
