"""pypto-offline: a graph-level fusion compiler for Huawei NPUs built on PyPTO.

Stages, each its own subpackage, data flowing one way:
``importer`` → ``fusion`` → ``pypto_kernels`` → ``offline_compiler`` → ``verify`` / ``report``;
``targets`` describes the chips. Importing this package does not import torch or pypto.
"""
from __future__ import annotations

from pypto_offline.errors import ModelError, PyptoOfflineError, UsageError
from pypto_offline.importer import ImportedGraph, import_model

__version__ = "0.1.0"

__all__ = ["ImportedGraph", "ModelError", "PyptoOfflineError", "UsageError", "__version__",
           "import_model"]
