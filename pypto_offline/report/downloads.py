"""What a reader can take away from the report, as data URLs inside the page (no request leaves
it): the compiled ONNX graph for Netron and the JSON summary. Each kernel's PyPTO source is
already in the page; the page's script makes its data URL when the link is clicked.

The compiled graph is shipped without its weights: tensors over ``WEIGHT_BYTES`` are marked as
external data in a file the page does not hold, which Netron shows as such, so the page of a
model with megabytes of weights stays small (docs/report.md, "Downloads").
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import onnx
from onnx import external_data_helper

from pypto_offline.importer.input_shapes import tensor_bytes
from pypto_offline.offline_compiler import ptom_pb2

WEIGHT_BYTES = 1024
LEFT_OUT = "weights-not-included.bin"
VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                "double_data", "uint64_data")


@dataclass(frozen=True)
class Download:
    label: str
    filename: str
    url: str
    size: int       # bytes of the file itself


def file_stem(message: ptom_pb2.CompiledModel) -> str:
    """``MODEL.TARGET``: what every file downloaded from the page is named after."""
    return f"{message.provenance.model_name.removesuffix('.onnx')}.{message.target.name}"


def downloads(message: ptom_pb2.CompiledModel, summary: dict) -> list[Download]:
    """``summary``: the blob's summary (``summary.summarise``), as the page shows it."""
    stem = file_stem(message)
    graph = graph_without_weights(message.onnx_model)
    summary = json.dumps(summary, indent=1, sort_keys=True).encode()
    return [
        Download(f"Compiled ONNX graph (opens in Netron; weights over {WEIGHT_BYTES} B left out)",
                 f"{stem}.compiled.onnx", _data_url("application/octet-stream", graph),
                 len(graph)),
        Download("JSON summary (as inspect --json)", f"{stem}.summary.json",
                 _data_url("application/json", summary), len(summary)),
    ]


def graph_without_weights(serialized: bytes) -> bytes:
    """The graph with each initializer over ``WEIGHT_BYTES`` turned into a reference to bytes
    in ``LEFT_OUT`` at its offset (ONNX's external data), its values dropped."""
    model = onnx.load_from_string(serialized)
    offset = 0
    for tensor in model.graph.initializer:
        size = tensor_bytes(tensor.dims, tensor.data_type)
        if size <= WEIGHT_BYTES:
            continue
        for field in VALUE_FIELDS:
            tensor.ClearField(field)
        tensor.raw_data = b"\0"  # set_external_data asks for raw data; it is dropped below
        external_data_helper.set_external_data(tensor, LEFT_OUT, offset, size)
        tensor.ClearField("raw_data")
        offset += size
    return model.SerializeToString(deterministic=True)


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"
