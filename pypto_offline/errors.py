"""Errors a user can act on.

A ``PyptoOfflineError`` is bad input or an unusable environment: the CLI prints its one-line message
(what, where, what to do) and exits with code 2, without a traceback. Anything else escaping the
pipeline is a bug of ours.
"""
from __future__ import annotations


class PyptoOfflineError(Exception):
    """Bad input: carries what went wrong, where, and what the user can do about it."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.fix = fix

    def __str__(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f" ({self.fix})"
        return " ".join(text.split())


class ModelError(PyptoOfflineError):
    """The ONNX model itself is malformed or outside what the compiler accepts."""


class UsageError(PyptoOfflineError):
    """The caller's options are wrong (unknown input name, bad shape string, ...)."""


class WorkerCannotStart(PyptoOfflineError):
    """A PyPTO worker process died before its imports (torch, pypto) succeeded: the environment
    is broken, and every region would fall back for the same reason (docs/workers.md)."""


class BuildInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM ended the build. A KeyboardInterrupt, so that both signals take one
    path: the workers are killed, nothing is written, and the CLI exits 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
