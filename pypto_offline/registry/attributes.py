"""What a stage does with an op, registered with the op (TVM's ``register_op_attr``): a stage
that needs per-op behaviour (a lowering, a refusal, a rewrite's root) registers it under an
attribute name here instead of keeping a table of its own keyed by op names, so everything the
compiler does with one op is found by asking the registry (``attributes_of``), and registering
it for an op ``registry/ops.py`` does not define, or twice, fails at import.

The attributes live where their stage is (a lowering in ``pypto_kernels/codegen``), which the
registry, on the ground floor, never imports: a table is complete once its stage is imported.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from pypto_offline.registry.ops import OPS, PROGRAM_ONLY_OPS
from pypto_offline.registry.ops import op_names as op_names_of

_TABLES: dict[str, dict[str, Any]] = {}


def register(attribute: str, op_names: str | Iterable[str]) -> Callable[[Any], Any]:
    """``@register(attribute, "Pad Slice")`` on a function (or ``register(...)(value)``):
    its value of ``attribute`` for each op named (space-separated, or an iterable)."""
    names = sorted(op_names_of(op_names))

    def put(value: Any) -> Any:
        table = _TABLES.setdefault(attribute, {})
        for name in names:
            if name not in OPS and name not in PROGRAM_ONLY_OPS:
                raise KeyError(f"{attribute!r} registered for {name}, which registry/ops.py "
                               "does not define: add its OpDef first")
            if name in table:
                raise ValueError(f"{attribute!r} of {name} registered twice")
            table[name] = value
        return value
    return put


def register_table(attribute_name: str, table: Mapping[str, Any]) -> Mapping[str, Any]:
    """Registers each op's value of the attribute from a stage's table (op name -> value);
    returns the table, read-only."""
    for name, value in table.items():
        register(attribute_name, name)(value)
    return MappingProxyType(dict(table))


def attribute(attribute_name: str, op_type: str, default: Any = None) -> Any:
    return _TABLES.get(attribute_name, {}).get(op_type, default)


def registered(attribute_name: str) -> Mapping[str, Any]:
    """Every op's value of the attribute (a live, read-only view)."""
    return MappingProxyType(_TABLES.setdefault(attribute_name, {}))


def attributes_of(op_type: str) -> dict[str, Any]:
    """Everything registered with the op, by attribute name (stages imported so far)."""
    return {name: table[op_type] for name, table in sorted(_TABLES.items()) if op_type in table}
