"""``pypto-offline op NAME``: what the compiler does with one op, from the registry alone: its
entry (``registry/ops.py``) and what each stage registered with it (``registry/attributes.py``:
its normaliser, encoder, lowering, activation builder, cost rules...) and the rewrite rules
rooted at it. The stages are imported first, so every registration is in."""
from __future__ import annotations

import dataclasses
import importlib

from pypto_offline.errors import UsageError

# The modules whose imports register per-op behaviour: every stage that registers any
REGISTERING_MODULES = (
    "pypto_offline.importer.canonical", "pypto_offline.importer.encoding",
    "pypto_offline.fusion.classify", "pypto_offline.fusion.cost", "pypto_offline.fusion.lower",
    "pypto_offline.fusion.rules", "pypto_offline.pypto_kernels.codegen",
)


def _where(value) -> str:
    """A registered value as its module and name (a function), or its repr (data)."""
    name = getattr(value, "__qualname__", None)
    return f"{value.__module__}.{name}" if name else repr(value)


def describe_op(name: str) -> dict:
    """The op's registry entry, what the stages registered with it, the rules rooted at it."""
    from pypto_offline.registry.attributes import attributes_of
    from pypto_offline.registry.ops import OPS

    if name not in OPS:
        raise UsageError(f"{name!r} is not an op the registry defines",
                         fix="name an ONNX op of registry/ops.py (case matters), e.g. Relu; "
                             "docs/architecture.md, 'Adding an op', says how to add one")
    for module in REGISTERING_MODULES:
        importlib.import_module(module)
    from pypto_offline.fusion.rules import ANY_OP, RULES

    entry = OPS[name]
    return {"op": name,
            "entry": dataclasses.asdict(entry),
            "properties": {p: getattr(entry, p) for p in _properties(entry)},
            "registered": {attribute: _where(value)
                           for attribute, value in attributes_of(name).items()},
            "rewrite_rules": [rule.__name__ for rule in RULES
                              if rule.roots is not ANY_OP and name in rule.roots]}


def _properties(entry) -> list[str]:
    return sorted(p for p, value in vars(type(entry)).items() if isinstance(value, property))


def human_op(description: dict) -> str:
    entry = description["entry"]
    lines = [f"{description['op']}: {entry['kind']}"]
    lines += [f"  {field:20s} {value}" for field, value in entry.items()
              if field not in ("name", "kind")]
    lines += [f"  {prop:20s} {value}" for prop, value in description["properties"].items()]
    lines.append("registered with it:")
    lines += [f"  {attribute:20s} {where}" for attribute, where in
              description["registered"].items()]
    rules = ", ".join(description["rewrite_rules"]) or "none"
    lines.append(f"rewrite rules rooted at it: {rules}")
    return "\n".join(lines)
