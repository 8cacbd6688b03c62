"""What a normaliser is given and how it registers (``importer/canonical.py`` holds the forms of
the movement and pooling ops and dispatches; ``contractions``, ``normalisations`` and
``quantised`` register theirs here too, so that no module of them imports another's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper

from pypto_offline.errors import ModelError
from pypto_offline.registry.attributes import register, registered


class NotCanonical(Exception):
    """The op cannot be put in canonical form (a run-time parameter): it stays a boundary."""


@dataclass
class NodeContext:
    """What a normaliser may look at."""

    node: onnx.NodeProto
    opset: int
    where: str
    constants: Mapping[str, np.ndarray]
    shapes: Mapping[str, tuple[int, ...] | None]
    dtypes: Mapping[str, int]

    def attr(self, name: str, default: Any = None) -> Any:
        for attribute in self.node.attribute:
            if attribute.name == name:
                return helper.get_attribute_value(attribute)
        return default

    def input_name(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def const(self, index: int) -> np.ndarray | None:
        """A constant input's value; None if the optional input is absent."""
        name = self.input_name(index)
        if not name:
            return None
        if name not in self.constants:
            raise NotCanonical(f"input {index} ({name!r}) is computed at run time")
        return self.constants[name]

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self.shapes.get(name)
        if shape is None:
            raise NotCanonical(f"the shape of {name!r} is not static")
        return tuple(shape)

    def in_shape(self, index: int = 0) -> tuple[int, ...]:
        return self.shape(self.input_name(index))

    def error(self, what: str, fix: str = "the model is inconsistent: re-export it") -> ModelError:
        return ModelError(what, where=self.where, fix=fix)

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        return axis % rank


Normaliser = Callable[[NodeContext], dict[str, Any]]


# Each op's normaliser, registered with the op (registry/attributes.py)
NORMALISER = "normaliser"
NORMALISERS: Mapping[str, Normaliser] = registered(NORMALISER)


def normaliser(*op_types: str) -> Callable[[Normaliser], Normaliser]:
    """``@normaliser("Slice")``: the function that writes a node of these ops in canonical
    form (its parameters explicit), or raises ``NotCanonical``."""
    return register(NORMALISER, op_types)


def as_ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def window_extents(spatial, pads, reach, strides) -> tuple[int, ...]:
    """The output rows and columns of a window reaching ``reach`` (its dilated size) over
    ``spatial`` padded by ``pads`` (top, left, bottom, right), at ``strides``, rounded down."""
    return tuple((size + begin + end - r) // s + 1 for size, begin, end, r, s in
                 zip(spatial, pads[:2], pads[2:], reach, strides))


def window_pads(ctx: NodeContext, spatial, kernel, strides) -> tuple[int, ...]:
    """(top, left, bottom, right), ``auto_pad`` SAME_UPPER/SAME_LOWER/VALID resolved."""
    auto = ctx.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        return tuple(as_ints(ctx.attr("pads", [0, 0, 0, 0])))
    if auto == "VALID":
        return (0, 0, 0, 0)
    totals = [max((-(-d // s) - 1) * s + k - d, 0) for d, k, s in zip(spatial, kernel, strides)]
    small = [t // 2 for t in totals]
    begins = small if auto == "SAME_UPPER" else [t - h for t, h in zip(totals, small)]
    return tuple(begins) + tuple(t - b for t, b in zip(totals, begins))


def schema_attributes(ctx: NodeContext) -> dict[str, Any]:
    """Every attribute the op's schema defines at this opset, defaults filled in."""
    schema = onnx.defs.get_schema(ctx.node.op_type, ctx.opset, "")
    params: dict[str, Any] = {}
    for name, attribute in schema.attributes.items():
        value = ctx.attr(name)
        if value is None and attribute.default_value.type != onnx.AttributeProto.UNDEFINED:
            value = helper.get_attribute_value(attribute.default_value)
        if value is not None:
            params[name] = value.decode() if isinstance(value, bytes) else value
    return params
