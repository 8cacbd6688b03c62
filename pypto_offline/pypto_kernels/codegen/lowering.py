"""The lowerings, each registered with its op from its kind's module (``movement``,
``elementwise``, ``reduction``, ``matmul``, ``convolution``, ``quantisation``), and the
dispatch through them. An op two modules lower is refused at import (the registry takes one
value of an attribute per op): which lowering runs must not depend on the order of imports."""
from __future__ import annotations

from typing import Callable, Mapping

from pypto_offline.fusion.records import RegionOp
from pypto_offline.registry.ops import definition
from pypto_offline.pypto_kernels.codegen import (convolution, elementwise, matmul, movement,
                                                 quantisation, reduction)
from pypto_offline.pypto_kernels.codegen.writer import CannotExpress, Writer
from pypto_offline.registry.attributes import register_table, registered

Lowering = Callable[[Writer, RegionOp], None]


LOWERING = "lowering"
for _kind in (movement, elementwise, reduction, matmul, convolution, quantisation):
    register_table(LOWERING, _kind.LOWERINGS)
LOWERINGS: Mapping[str, Lowering] = registered(LOWERING)


def lowers(op_type: str) -> bool:
    """Whether the generator has a lowering for the op (``registry/ops.py`` marks the same).
    A region's program holds its reshape-likes as one Reshape (``fusion/program.py``), and
    a rewrite rule writes the ``DECOMPOSED`` ops as others (``fusion/rules.py``)."""
    entry = definition(op_type)
    return entry.view_only or entry.decomposed or op_type in LOWERINGS


def lower(w: Writer, op: RegionOp) -> None:
    """The op's statements, by its kind's lowering."""
    lower_op = LOWERINGS.get(op.op_type)
    if lower_op is None:
        raise CannotExpress(f"no PyPTO lowering for {op.op_type}")
    lower_op(w, op)
