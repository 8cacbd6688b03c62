"""Tiny one-node models for unit tests (synthetic on purpose: they test rules, not claims)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def one_node(op_type: str, x_shape, *, opset: int, params: dict | None = None, outputs: int = 1,
             x_dtype=onnx.TensorProto.FLOAT, runtime_inputs=(), out_shape=None,
             **attrs) -> onnx.ModelProto:
    """``op_type(x, *params, *runtime_inputs)``; ``params`` maps input names to constant values
    (None = an absent optional input); ``runtime_inputs`` are (name, elem_type, shape) graph
    inputs; ``out_shape`` types the outputs where onnx's inference cannot (a broken model)."""
    initializers, inputs = [], ["x"]
    for name, value in (params or {}).items():
        if value is None:
            inputs.append("")
            continue
        initializers.append(numpy_helper.from_array(np.asarray(value), name))
        inputs.append(name)
    inputs += [name for name, _, _ in runtime_inputs]
    while inputs and inputs[-1] == "":
        inputs.pop()
    names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, inputs, names, name=f"the_{op_type.lower()}", **attrs)
    graph_inputs = [helper.make_tensor_value_info("x", x_dtype, list(x_shape))]
    graph_inputs += [helper.make_tensor_value_info(*spec) for spec in runtime_inputs]
    graph = helper.make_graph([node], "unit", graph_inputs,
                              [onnx.ValueInfoProto(name=n) for n in names], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if out_shape is not None:
        for output in model.graph.output:
            output.CopyFrom(helper.make_tensor_value_info(output.name, x_dtype, out_shape))
        return model
    return onnx.shape_inference.infer_shapes(model)  # types the outputs, as an exporter would


def seeded(shape, dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class GraphBuilder:
    """Small multi-node models: ``b.op("Slice", [x], starts=[...], ...)`` returns the output name.
    Keyword arguments that are lists/arrays of a param input become int64 initializers; the rest
    are attributes."""

    PARAM_INPUTS = {"Slice": ("starts", "ends", "axes", "steps"), "Pad": ("pads", "value"),
                    "Tile": ("repeats",), "Expand": ("shape",), "Reshape": ("shape",),
                    "Split": ("split",), "Squeeze": ("axes",), "Unsqueeze": ("axes",),
                    "Gather": ("indices",)}

    def __init__(self, opset: int = 18):
        self.opset = opset
        self.nodes, self.inputs, self.initializers = [], [], []
        self._count = 0

    def input(self, name: str, shape, dtype=onnx.TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, value, dtype=None) -> str:
        self._count += 1
        name = f"c{self._count}"
        array = np.asarray(value, dtype=dtype or (np.int64 if np.asarray(value).dtype.kind == "i"
                                                  else np.float32))
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs, outputs: int = 1, **kwargs):
        inputs = list(inputs)
        for param in self.PARAM_INPUTS.get(op_type, ()):
            if param in kwargs:
                value = kwargs.pop(param)
                inputs.append(self.const(value, np.float32 if param == "value" else np.int64))
            else:
                inputs.append("")  # an absent optional input; trailing ones are dropped
        while inputs and inputs[-1] == "":
            inputs.pop()
        self._count += 1
        names = [f"t{self._count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"n{self._count}",
                                           **kwargs))
        return names[0] if outputs == 1 else names

    def model(self, *outputs: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "built", self.inputs,
                                  [onnx.ValueInfoProto(name=o) for o in outputs],
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model)

