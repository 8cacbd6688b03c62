"""pypto-offline: a graph-level fusion compiler for Huawei NPUs built on PyPTO.

Stages, each its own subpackage, data flowing one way:
``importer`` → ``fusion`` → ``pypto_kernels`` → ``offline_compiler`` → ``verify`` / ``report``;
``targets`` describes the chips. Importing this package imports only the standard library
(numpy and onnx come with ``import_model``, torch and pypto with a compile): the command's entry
point (``entry``) holds a Ctrl-C while the rest loads.
"""
from __future__ import annotations

__version__ = "0.1.0"

from pypto_offline.errors import ModelError, PyptoOfflineError, UsageError  # noqa: E402


def __getattr__(name: str):
    """``ImportedGraph`` and ``import_model``, from ``importer`` when first asked for."""
    if name in ("ImportedGraph", "import_model"):
        from pypto_offline import importer

        return getattr(importer, name)
    raise AttributeError(f"module 'pypto_offline' has no attribute {name!r}")


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
