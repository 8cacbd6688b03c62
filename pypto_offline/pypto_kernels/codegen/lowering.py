"""The one table of lowerings, merged from each op kind's (``movement``, ``elementwise``,
``reduction``, ``matmul``, ``convolution``), and the dispatch through it. An op in two kinds' tables is refused at
import: which lowering runs must not depend on the order of the merge."""
from __future__ import annotations

from typing import Callable, Mapping

from pypto_offline.fusion.records import RegionOp
from pypto_offline.registry.ops import definition
from pypto_offline.pypto_kernels.codegen import (convolution, elementwise, matmul, movement,
                                                 quantisation, reduction)
from pypto_offline.pypto_kernels.codegen.writer import CannotExpress, Writer

Lowering = Callable[[Writer, RegionOp], None]


def merged(tables: Mapping[str, Mapping[str, Lowering]]) -> dict[str, Lowering]:
    """The union of the kinds' tables (kind name -> table); ValueError if an op is in two."""
    union: dict[str, Lowering] = {}
    kind_of: dict[str, str] = {}
    for kind, table in tables.items():
        for op_type, lower_op in table.items():
            if op_type in union:
                raise ValueError(f"{op_type} is lowered by both {kind_of[op_type]} and {kind}")
            union[op_type], kind_of[op_type] = lower_op, kind
    return union


LOWERINGS: dict[str, Lowering] = merged({
    "movement": movement.LOWERINGS, "elementwise": elementwise.LOWERINGS,
    "reduction": reduction.LOWERINGS, "matmul": matmul.LOWERINGS,
    "convolution": convolution.LOWERINGS, "quantisation": quantisation.LOWERINGS,
})


def lowers(op_type: str) -> bool:
    """Whether the generator has a lowering for the op (``registry/ops.py`` marks the same).
    A region's program holds its reshape-likes as one Reshape (``fusion/program.py``), and
    a rewrite rule writes the ``DECOMPOSED`` ops as others (``fusion/rules.py``)."""
    return definition(op_type).view_only or definition(op_type).decomposed or op_type in LOWERINGS


def lower(w: Writer, op: RegionOp) -> None:
    """The op's statements, by its kind's lowering."""
    lower_op = LOWERINGS.get(op.op_type)
    if lower_op is None:
        raise CannotExpress(f"no PyPTO lowering for {op.op_type}")
    lower_op(w, op)
