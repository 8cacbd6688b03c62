"""pypto-offline: a graph-level fusion compiler for Huawei NPUs built on PyPTO.

Stages, each its own subpackage, data flowing one way:
``importer`` → ``fusion`` → ``pypto_kernels`` → ``offline_compiler`` → ``verify`` / ``report``;
``targets`` describes the chips. Importing this package does not import torch or pypto.
"""
from __future__ import annotations

__version__ = "0.1.0"

from pypto_offline.errors import ModelError, PyptoOfflineError, UsageError  # noqa: E402
from pypto_offline.importer import ImportedGraph, import_model  # noqa: E402


def compile(model, target: str = "kirin9050", input_shapes=None, **options):  # noqa: A001
    """Compile a model for a target; see ``pypto_offline.api.compile``."""
    from pypto_offline import api

    return api.compile(model, target, input_shapes, **options)


def load(path, expected_target: str | None = None):
    """Read a .ptom blob; see ``pypto_offline.api.load``."""
    from pypto_offline import api

    return api.load(path, expected_target)


__all__ = ["ImportedGraph", "ModelError", "PyptoOfflineError", "UsageError", "__version__",
           "compile", "import_model", "load"]
