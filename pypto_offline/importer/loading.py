"""Read a model from a path, bytes or a ModelProto, with its external data, safely."""
from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.user_files import read_regular

# The .ptom blob is one protobuf message holding the weights, and protobuf stops at 2 GiB; a phone
# NPU model that large would not fit its memory either. Checked on the declared sizes, before any
# external data is read.
MAX_MODEL_BYTES = 2**31 - 1

def load_model(source, base_dir: str | os.PathLike | None = None) -> tuple[onnx.ModelProto, str]:
    """Return (a private copy of the model with all external data loaded, a label for messages)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        label = "<ModelProto>"
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "<bytes>")
        label = "<bytes>"
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = str(path)
        model = _parse(_read_file(path), label)
        base_dir = path.parent if base_dir is None else base_dir
    else:
        raise UsageError(f"cannot load a model from a {type(source).__name__}",
                         fix="pass a path, the model's bytes or an onnx.ModelProto")
    _require_onnx_model(model, label)
    _load_external_data(model, base_dir, label)
    return model, label


def _read_file(path: Path) -> bytes:
    try:
        return read_regular(path, "the model's path", "give the path of an .onnx file")
    except FileNotFoundError:
        raise UsageError("no such file", where=str(path), fix="check the model path") from None
    except OSError as err:
        raise UsageError(f"cannot read the file: {err.strerror}", where=str(path)) from None


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise ModelError("not a readable ONNX model (the protobuf does not parse: truncated or "
                         "not ONNX)", where=label, fix="re-export or re-download the model") from None
    return model


def _require_onnx_model(model: onnx.ModelProto, label: str) -> None:
    # Arbitrary bytes sometimes parse as an (empty) protobuf message; a real model has both.
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.node:
        raise ModelError("not an ONNX model (no IR version or no graph nodes)", where=label,
                         fix="pass an .onnx file exported by a framework")


def _external_tensors(model: onnx.ModelProto):
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if uses_external_data(tensor):
            yield tensor


def _load_external_data(model: onnx.ModelProto, base_dir, label: str) -> None:
    tensors = list(_external_tensors(model))
    if not tensors:
        return
    if base_dir is None:
        raise UsageError("the model keeps weights in external data files, but no folder is known",
                         where=label, fix="load it from its path, or pass base_dir=")
    root = Path(base_dir).resolve()
    for tensor in tensors:
        _check_external_location(tensor, root, label)
    _check_declared_size(model, label)
    onnx.external_data_helper.load_external_data_for_model(model, str(root))


def _check_declared_size(model: onnx.ModelProto, label: str) -> None:
    total = model.ByteSize() + sum(_declared_bytes(t) for t in _external_tensors(model))
    if total > MAX_MODEL_BYTES:
        raise ModelError(f"the model declares {total / 1e9:.1f} GB of weights and graph; a .ptom "
                         f"blob holds at most 2 GB (one protobuf message)", where=label,
                         fix="split the model, or quantise its weights below 2 GB")


def _declared_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    elements = 1
    for dim in tensor.dims:
        elements *= dim
    return elements * itemsize


def _check_external_location(tensor: onnx.TensorProto, root: Path, label: str) -> None:
    info = ExternalDataInfo(tensor)
    where = f"{label}, initializer {tensor.name!r}"
    location = Path(info.location)
    target = (root / location).resolve()
    if location.is_absolute() or not target.is_relative_to(root):
        raise ModelError(f"external data location {info.location!r} escapes the model's folder",
                         where=where, fix="keep external data files next to the model")
    if not target.is_file():
        raise ModelError(f"external data file {info.location!r} is missing", where=where,
                         fix="copy the data file next to the model")
    size = target.stat().st_size
    length = info.length if info.length else size - (info.offset or 0)
    if (info.offset or 0) + length > size:
        raise ModelError(f"external data {info.location!r} is shorter than the tensor declares "
                         f"({size} bytes, needs {(info.offset or 0) + length})", where=where,
                         fix="the data file is truncated: copy it again")
