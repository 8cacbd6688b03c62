"""The files a user names to be read (a model, a blob, ``--keep_dtype``, ``--inputs``): only a
regular file is read. A FIFO would block the open, and then the read, until some writer came:
forever; a device reads without end; a folder does not read. Each is refused, with exit 2, naming
the option or argument that gave it, before a byte is read."""
from __future__ import annotations

import os
import stat
from typing import BinaryIO

from pypto_offline.errors import UsageError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe (FIFO)"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path, what: str, fix: str | None = None) -> BinaryIO:
    """``path`` open for reading, in binary, when it is a regular file (or a link to one); else
    a ``UsageError`` naming ``what`` (``"--keep_dtype"``, ``"the model"``) and the path. It is
    opened without blocking (a FIFO's open waits for a writer otherwise) and the open file is
    checked, so nothing can be swapped in between. An ``OSError`` of the open itself (no such
    file, no permission) is left to the caller, which words it for what it reads."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise UsageError(f"{what} names {kind}, not a file to read", where=str(path),
                             fix=fix or "give the path of a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_regular(path, what: str, fix: str | None = None, limit: int = -1) -> bytes:
    """The bytes of the regular file ``path`` (``open_regular``), at most ``limit`` of them."""
    with open_regular(path, what, fix) as stream:
        return stream.read(limit)
