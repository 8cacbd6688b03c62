"""Chip descriptors (Kirin and Ascend). Imports nothing of ours outside ``targets``; read by every
stage. Names are resolved (with a user-facing error) by the API and CLI."""
from __future__ import annotations

from pypto_offline.targets.ascend import ASCEND910B, ASCEND950
from pypto_offline.targets.descriptor import Figure, KernelSupport, Target
from pypto_offline.targets.kirin import KIRIN90, KIRIN9030, KIRIN9050

TARGETS: dict[str, Target] = {t.name: t for t in (KIRIN90, KIRIN9030, KIRIN9050, ASCEND910B,
                                                   ASCEND950)}

__all__ = ["TARGETS", "Figure", "KernelSupport", "Target"]
