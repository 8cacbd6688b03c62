"""The .ptom file: magic, format version, payload digest, payload (``ptom.proto``).

Writing is deterministic (sorted maps, no timestamps) and atomic (a temporary file in the same
folder, renamed into place). Reading checks every layer and refuses a damaged file with one clear
error: a flipped or missing byte anywhere fails the digest or the header. Output paths are checked
before any work (``check_outputs``) and a blob is written together with its report
(``write_together``): see docs/outputs.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Mapping

import onnx
from google.protobuf.message import DecodeError

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.offline_compiler import gears, ptom_pb2
from pypto_offline.user_files import read_regular

MAGIC = b"PTOM"
FORMAT_VERSION = 1
# A blob of several gears (CompiledModel.gears, docs/gears.md); one of a single shape stays
# version 1, byte for byte what it was.
FORMAT_VERSION_GEARS = 2
HEADER = struct.Struct("<4sI32s")  # magic, format version, sha256(payload)


def format_version(message: ptom_pb2.CompiledModel) -> int:
    return FORMAT_VERSION_GEARS if message.gears else FORMAT_VERSION


def to_bytes(message: ptom_pb2.CompiledModel) -> bytes:
    payload = message.SerializeToString(deterministic=True)
    return HEADER.pack(MAGIC, format_version(message),
                       hashlib.sha256(payload).digest()) + payload


def from_bytes(data: bytes, where: str = "<bytes>",
               expected_target: str | None = None) -> ptom_pb2.CompiledModel:
    fix = "rebuild it with pypto-offline"
    if len(data) < HEADER.size:
        raise ModelError(f"not a .ptom blob: {len(data)} bytes is shorter than its header",
                         where=where, fix=fix)
    magic, version, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ModelError("not a .ptom blob (wrong magic bytes)", where=where, fix=fix)
    if version not in (FORMAT_VERSION, FORMAT_VERSION_GEARS):
        raise ModelError(f"blob format version {version}, this pypto-offline reads versions "
                         f"{FORMAT_VERSION} and {FORMAT_VERSION_GEARS}", where=where, fix=fix)
    payload = data[HEADER.size:]
    if hashlib.sha256(payload).digest() != digest:
        raise ModelError("blob is damaged: its content does not match its digest (truncated or "
                         "altered)", where=where, fix=fix)
    message = ptom_pb2.CompiledModel()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        raise ModelError("blob payload does not parse", where=where, fix=fix) from None
    graphs = _check_content(message, where, fix)
    gears.check(message, version == FORMAT_VERSION_GEARS, where, fix, graphs)
    for gear in message.gears[1:]:
        _check_content(gear.build, where, fix)
    if expected_target and message.target.name != expected_target:
        raise ModelError(f"blob is compiled for {message.target.name!r}, not {expected_target!r}",
                         where=where, fix=f"compile the model with --target {expected_target}")
    return message


def _check_content(message: ptom_pb2.CompiledModel, where: str, fix: str
                   ) -> dict[str, onnx.ModelProto]:
    """What every reader relies on, checked once here: a payload can carry a valid digest and
    still be wrong (a buggy writer, a hand edit). Returns its graphs, parsed, by field."""
    from pypto_offline.targets import TARGETS

    if message.target.name not in TARGETS:
        raise ModelError(f"blob names an unknown target {message.target.name!r}", where=where,
                         fix=fix)
    _check_chip(message, TARGETS[message.target.name].soc_version.value, where, fix)
    if not message.provenance.tool_version or not message.provenance.model_sha256:
        raise ModelError("blob has no provenance", where=where, fix=fix)
    graphs = {}
    for field in gears.GRAPHS:
        model = graphs[field] = onnx.ModelProto()
        try:
            model.ParseFromString(getattr(message, field))
        except DecodeError:
            raise ModelError(f"blob's {field} does not parse as ONNX", where=where,
                             fix=fix) from None
        if not model.graph.node:
            raise ModelError(f"blob's {field} has no graph", where=where, fix=fix)
        if not all(isinstance(name, str) for name in _graph_names(model.graph)):
            raise ModelError(f"blob's {field} holds a name that is not UTF-8 text", where=where,
                             fix=fix)
    ids = [k.id for k in message.kernels]
    if len(set(ids)) != len(ids) or not all(ids):
        raise ModelError("blob's kernel ids are empty or repeated", where=where, fix=fix)
    return graphs


def _check_chip(message: ptom_pb2.CompiledModel, chip: str, where: str, fix: str) -> None:
    """The chip a blob's kernels were compiled under (its platform record) and the one its
    target descriptor names are its target's: a target's platform is always made for its
    SoC_version (pypto_kernels/platform.py), so another chip is a blob renamed, not rebuilt."""
    claims = [("its kernels were compiled under", message.platform.chip, chip)]
    claims += [("its target descriptor names", f.value, json.dumps(chip))  # as build writes it
               for f in message.target.figures if f.name == "soc_version"]
    for what, claim, expected in claims:
        if claim != expected:
            raise ModelError(f"blob is for {message.target.name!r} (chip {chip}) but {what} "
                             f"{claim or 'no chip'}", where=where, fix=fix)


def _graph_names(graph: onnx.GraphProto):
    """Every name and op type of a graph's nodes and values. ONNX's strings are proto2's, which
    protobuf does not check: one of invalid UTF-8 reads back as bytes, and every reader of the
    graph (report, verify) takes names for text."""
    for node in graph.node:
        yield from (node.op_type, node.name, node.domain, *node.input, *node.output)
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        yield value.name


def write(path: Path, message: ptom_pb2.CompiledModel) -> Path:
    write_atomically(path, to_bytes(message))
    return path


def read(path: Path, expected_target: str | None = None) -> ptom_pb2.CompiledModel:
    try:
        data = read_regular(path, "the blob's path", "give the path of a .ptom file")
    except OSError as error:
        raise ModelError(f"cannot read the blob: {error.strerror}", where=str(path),
                         fix="check the path") from None
    return from_bytes(data, str(path), expected_target)


def check_writable(path: Path) -> None:
    """Fail before the work, not after: the folder an output goes to must exist and be writable,
    and what the path names now, if anything, must be a regular file to replace (not a folder,
    a device such as /dev/null, or a pipe)."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"the folder {str(folder)!r} does not exist", where=str(path),
                         fix="create it, or choose another output path")
    if path.exists() and not path.is_file():
        raise UsageError("the output path names a folder, a device or a pipe, not a file",
                         where=str(path), fix="give the path of a file to write")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"the folder {str(folder)!r} cannot be written", where=str(path),
                         fix="choose a folder you can write to")


def check_outputs(outputs: Mapping[str, Path], inputs: Mapping[str, Path]) -> None:
    """Every output writable, none the same file as an input or as another output (compared as
    files: through symbolic links, ``..`` and hard links). Labels name them in the message."""
    for label, path in outputs.items():
        check_writable(path)
        for other_label, other in list(inputs.items()) + list(outputs.items()):
            if other_label != label and same_file(path, other):
                raise UsageError(f"{label} {str(path)!r} is the same file as the {other_label}; "
                                 f"writing it would destroy it", where=str(path),
                                 fix=f"give {label} another path")


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet: the same path once resolved is the same file
        return os.path.realpath(a) == os.path.realpath(b)


def write_atomically(path: Path, data: bytes) -> None:
    """A temporary file next to ``path``, renamed over it: no half-written file, ever."""
    write_together({Path(path): data})


def write_together(files: Mapping[Path, bytes]) -> None:
    """Write files as one: each is staged to a temporary file in its folder first, and only when
    all are staged are they renamed into place, in the given order (so a blob given last appears
    only once its report is there). A failure leaves none of them behind."""
    staged: dict[Path, str] = {}
    placed: list[Path] = []
    try:
        for path, data in files.items():
            staged[Path(path)] = _stage(Path(path), data)
        for path, temporary in staged.items():
            try:
                os.replace(temporary, path)
            except OSError as error:
                raise UsageError(f"cannot write there: {error.strerror}", where=str(path),
                                 fix="choose another output path") from None
            placed.append(path)
    except BaseException:
        for temporary in staged.values():
            Path(temporary).unlink(missing_ok=True)
        for path in placed:  # a later rename failed: take back what this write put there
            path.unlink(missing_ok=True)
        raise


def _stage(path: Path, data: bytes) -> str:
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
    except OSError as error:
        Path(staged).unlink(missing_ok=True)
        raise UsageError(f"cannot write there: {error.strerror}", where=str(path),
                         fix="free some space or choose another folder") from None
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
    return staged
