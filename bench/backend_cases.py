"""The ONNX backend node test cases for the ops in the importer's scope.

The onnx wheel ships the case generators, not the data: ``collect_testcases`` builds (model,
inputs, expected outputs) for each. It filters on op type only on its first call in a process, so
all cases are collected once and filtered here. Operator parameters that a case passes as graph
inputs (Slice's starts, Pad's pads, ...) are turned into initializers, as they are in real models,
so that the canonical path is what gets tested.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from pypto_offline.registry.ops import OPS


@dataclass(frozen=True)
class BackendCase:
    name: str
    op_type: str
    opset: int
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    outputs: list[np.ndarray]
    rtol: float
    atol: float


# QOperator ops the importer expands (importer/qoperator.py): only their first input is data;
# scales, zero points, weights and bias are a quantised model's constants
QOPERATOR_DATA_INPUTS = {"QLinearConv": 1, "QLinearMatMul": 1}


@functools.lru_cache(maxsize=1)
def in_scope_cases() -> tuple[BackendCase, ...]:
    return _cases(set(OPS))


@functools.lru_cache(maxsize=1)
def qoperator_cases() -> tuple[BackendCase, ...]:
    return _cases(set(QOPERATOR_DATA_INPUTS))


@functools.lru_cache(maxsize=1)
def _collected() -> tuple:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


def _cases(ops: set[str]) -> tuple[BackendCase, ...]:
    cases = []
    for case in _collected():
        nodes = case.model.graph.node
        if case.kind != "node" or len(nodes) != 1 or nodes[0].op_type not in ops:
            continue
        for index, (inputs, outputs) in enumerate(case.data_sets):
            name = case.name if len(case.data_sets) == 1 else f"{case.name}_{index}"
            inputs, outputs = [_as_array(v) for v in inputs], [_as_array(v) for v in outputs]
            cases.append(_bind_parameters(name, case, inputs, outputs))
    return tuple(cases)


def _as_array(value):
    """Cases of exotic dtypes (float8, int4, ...) carry TensorProtos; sequences carry lists."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_as_array(v) for v in value]
    return value


def _bind_parameters(name, case, inputs, outputs) -> BackendCase:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    first_param = QOPERATOR_DATA_INPUTS.get(node.op_type) or OPS[node.op_type].data_inputs \
        or len(node.input)  # the rest are parameters
    params = {n for n in list(node.input)[first_param:] if n}
    feeds = {}
    kept_inputs = []
    for value, data in zip(list(model.graph.input), inputs):
        if value.name in params:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(data), value.name))
        else:
            kept_inputs.append(value)
            feeds[value.name] = data
    del model.graph.input[:]
    model.graph.input.extend(kept_inputs)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return BackendCase(name, node.op_type, opset, model, feeds, outputs, case.rtol, case.atol)
