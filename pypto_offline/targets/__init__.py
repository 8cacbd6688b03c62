"""Chip descriptors (Kirin and Ascend). Imports nothing of ours outside ``targets``; read by every
stage. Names are resolved here (``resolve_target``); the API and CLI turn a miss into the user's
error."""
from __future__ import annotations

from pypto_offline.targets.ascend import ASCEND910B, ASCEND950
from pypto_offline.targets.descriptor import Figure, KernelSupport, Target
from pypto_offline.targets.kirin import KIRIN90, KIRIN9030, KIRIN9050

TARGETS: dict[str, Target] = {t.name: t for t in (KIRIN90, KIRIN9030, KIRIN9050, ASCEND910B,
                                                   ASCEND950)}

# The chip names users type (ATC's --soc_version spellings) → the target that models the chip,
# beyond each target's own name and its descriptor's soc_version, which resolve too. Compared
# case-insensitively. A chip whose figures differ from its target's (fewer cores, another clock
# or memory) is compiled with the target's: docs/target-sources.md, "Chip names", says how each
# differs. Kirin9050 is KirinDev0000 by an inference (the kirin9050 descriptor's notes).
CHIP_NAMES: dict[str, str] = {
    "Kirin90": "kirin90",
    "Kirin9050": "kirin9050",
    "Ascend910B": "ascend910b", "Ascend910B2": "ascend910b", "Ascend910B3": "ascend910b",
    "Ascend910B4": "ascend910b",
    "Ascend950": "ascend950", "Ascend950PR": "ascend950", "Ascend950DT": "ascend950",
}


def chip_names(target: Target) -> list[str]:
    """The names besides its own that a target answers to: its soc_version, then the aliases."""
    names = [target.soc_version.value] + [n for n, t in CHIP_NAMES.items() if t == target.name]
    return list(dict.fromkeys(names))


_BY_NAME: dict[str, Target] = {name.lower(): target for target in TARGETS.values()
                               for name in (target.name, *chip_names(target))}


def resolve_target(name: str) -> Target | None:
    """The target a user's name for a chip means (``kirin9050``, ``Kirin9050``, ``ASCEND910B3``),
    or None when it names none."""
    return _BY_NAME.get(name.strip().lower())


def known_names() -> list[str]:
    """Every name ``resolve_target`` takes, as a user would write it: targets, then chips."""
    return list(TARGETS) + [n for t in TARGETS.values() for n in chip_names(t)]


__all__ = ["CHIP_NAMES", "TARGETS", "Figure", "KernelSupport", "Target", "chip_names",
           "known_names", "resolve_target"]
