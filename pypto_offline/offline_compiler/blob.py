"""The .ptom file: magic, format version, payload digest, payload (``ptom.proto``).

Writing is deterministic (sorted maps, no timestamps) and atomic (a temporary file in the same
folder, renamed into place). Reading checks every layer and refuses a damaged file with one clear
error: a flipped or missing byte anywhere fails the digest or the header.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.offline_compiler import ptom_pb2

MAGIC = b"PTOM"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sI32s")  # magic, format version, sha256(payload)


def to_bytes(message: ptom_pb2.CompiledModel) -> bytes:
    payload = message.SerializeToString(deterministic=True)
    return HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload


def from_bytes(data: bytes, where: str = "<bytes>",
               expected_target: str | None = None) -> ptom_pb2.CompiledModel:
    fix = "rebuild it with pypto-offline"
    if len(data) < HEADER.size:
        raise ModelError(f"not a .ptom blob: {len(data)} bytes is shorter than its header",
                         where=where, fix=fix)
    magic, version, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ModelError("not a .ptom blob (wrong magic bytes)", where=where, fix=fix)
    if version != FORMAT_VERSION:
        raise ModelError(f"blob format version {version}, this pypto-offline reads version "
                         f"{FORMAT_VERSION}", where=where, fix=fix)
    payload = data[HEADER.size:]
    if hashlib.sha256(payload).digest() != digest:
        raise ModelError("blob is damaged: its content does not match its digest (truncated or "
                         "altered)", where=where, fix=fix)
    message = ptom_pb2.CompiledModel()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        raise ModelError("blob payload does not parse", where=where, fix=fix) from None
    if expected_target and message.target.name != expected_target:
        raise ModelError(f"blob is compiled for {message.target.name!r}, not {expected_target!r}",
                         where=where, fix=f"compile the model with --target {expected_target}")
    return message


def write(path: Path, message: ptom_pb2.CompiledModel) -> Path:
    write_atomically(path, to_bytes(message))
    return path


def read(path: Path, expected_target: str | None = None) -> ptom_pb2.CompiledModel:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ModelError(f"cannot read the blob: {error.strerror}", where=str(path),
                         fix="check the path") from None
    return from_bytes(data, str(path), expected_target)


def check_writable(path: Path) -> None:
    """Fail before the work, not after: the folder an output goes to must exist."""
    if not Path(path).parent.is_dir():
        raise UsageError(f"the folder {str(Path(path).parent)!r} does not exist", where=str(path),
                         fix="create it, or choose another output path")


def write_atomically(path: Path, data: bytes) -> None:
    """A temporary file next to ``path``, renamed over it: no half-written file, ever."""
    path = Path(path)
    check_writable(path)
    try:
        handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise UsageError(f"cannot write there: {error.strerror}", where=str(path),
                         fix="choose a folder you can write to") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staged, 0o666 & ~umask)  # mkstemp makes 0600; a blob is an ordinary file
        os.replace(staged, path)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
