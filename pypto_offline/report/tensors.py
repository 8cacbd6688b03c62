"""Shape and dtype of every tensor the report names, read from the imported graph the blob keeps
(``source_onnx_model``: the importer wrote a value_info for every tensor, shapes static)."""
from __future__ import annotations

from dataclasses import dataclass

import onnx

from pypto_offline.importer.input_shapes import dtype_name


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int | str, ...]
    dtype: str      # numpy's name: float32, int64, ...

    @property
    def text(self) -> str:
        """``1×3×224×224 float32``; a scalar is ``scalar float32``."""
        dims = "×".join(str(d) for d in self.shape) if self.shape else "scalar"
        return f"{dims} {self.dtype}"


UNKNOWN = TensorType((), "unknown")


def tensor_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """Every named tensor of the graph: inputs, outputs, intermediates and initializers."""
    types = {init.name: TensorType(tuple(init.dims), dtype_name(init.data_type))
             for init in model.graph.initializer}
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if value.type.HasField("tensor_type"):
            types[value.name] = _value_type(value.type.tensor_type)
    return types


def _value_type(tensor: onnx.TypeProto.Tensor) -> TensorType:
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in tensor.shape.dim)
    return TensorType(dims, dtype_name(tensor.elem_type))


def graph_io(model: onnx.ModelProto, types: dict[str, TensorType]
             ) -> tuple[list[tuple[str, TensorType]], list[tuple[str, TensorType]]]:
    """The model's inputs (initializers listed as inputs left out) and outputs, in order."""
    weights = {init.name for init in model.graph.initializer}
    inputs = [(v.name, types.get(v.name, UNKNOWN)) for v in model.graph.input
              if v.name not in weights]
    return inputs, [(v.name, types.get(v.name, UNKNOWN)) for v in model.graph.output]
