"""The simplification pass: apply the rewrite rules to a region's program until none fires."""
from __future__ import annotations

from pypto_offline.fusion.program import Program
from pypto_offline.fusion.rules import ANY_OP, RULES, Rule

# Every rule shortens a chain or removes an op, so a fixed point comes quickly; the cap only
# guards against a rule pair that would undo each other.
MAX_REWRITES = 500


def simplify(program: Program, rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Rewrite ``program`` in place; returns the names of the rules applied, in order."""
    applied: list[str] = []
    while len(applied) < MAX_REWRITES:
        fired = _first_rewrite(program, rules)
        if fired is None:
            break
        applied.append(fired)
        program.prune()
    program.prune()
    return applied


def _first_rewrite(program: Program, rules: tuple[Rule, ...]) -> str | None:
    for op in list(program.ops):
        for rule in rules:
            if not _roots_include(rule, op.op_type):
                continue
            replacement = rule(program, op)
            if replacement is not None:
                program.replace(op, replacement)
                return rule.__name__
    return None


def _roots_include(rule: Rule, op_type: str) -> bool:
    """Whether the rule rewrites this op (``rules.rewrites``: its roots, or every op)."""
    roots = getattr(rule, "roots", ANY_OP)
    return roots is ANY_OP or op_type in roots
