"""The records the importer hands to the fusion stage: plain, immutable, and serialisable."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import onnx

from pypto_offline.importer.bands import could_be_in_source, in_source


@dataclass(frozen=True)
class TensorInfo:
    """Static facts of one tensor; ``shape`` is None where it stayed symbolic."""

    name: str
    dtype: int  # onnx.TensorProto element type
    shape: tuple[int, ...] | None

    @property
    def is_static(self) -> bool:
        return self.shape is not None

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        if self.shape is None:
            raise ValueError(f"tensor {self.name!r} has no static shape")
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize


@dataclass(frozen=True)
class Node:
    """One node of the normalised graph.

    ``params`` holds the canonical parameters of an in-scope op (e.g. Slice's full-rank
    ``starts``/``ends``/``steps``), whatever opset and encoding the source model used; it is empty
    for ops that pass through. ``why_not_canonical`` says why an op of the scope list could not be
    normalised (a data-dependent parameter, say), which makes it a boundary for fusion.
    """

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    in_scope: bool = False
    why_not_canonical: str | None = None


@dataclass(frozen=True)
class ImportStats:
    """What the import did, for the summary and the benchmarks."""

    nodes_in_source: int
    nodes_after_folding: int
    nodes_normalised: Mapping[str, int]
    shapes_corrected: tuple[str, ...]
    seconds: float
    # A QDQ model's contractions made integer, and those left float with why
    # (importer/quantised.py): {"integer": [output names], "left_float": {output: why}}
    quantised: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ImportedGraph:
    """A model with static shapes, folded, every in-scope op in canonical form.

    ``model`` is the same graph as ONNX (the source of truth for running it); ``nodes`` and
    ``tensors`` are its index for the compiler. ``symbolic`` names tensors whose shape stayed
    unknown (they cannot be fused).
    """

    model: onnx.ModelProto
    opset: int
    nodes: tuple[Node, ...]
    tensors: Mapping[str, TensorInfo]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: frozenset[str]
    symbolic: tuple[str, ...]
    stats: ImportStats

    def constant_values(self) -> dict[str, np.ndarray]:
        """Initializer name → value: the tensors known at compile time."""
        from onnx import numpy_helper

        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}

    @cached_property
    def _initializers(self) -> dict[str, onnx.TensorProto]:
        return {t.name: t for t in self.model.graph.initializer}

    def constant(self, name: str) -> np.ndarray | None:
        """One initializer's value (None if ``name`` is none), without converting the others
        as ``constant_values`` does: a rule asking for a scalar of a model of MBs of weights."""
        from onnx import numpy_helper

        tensor = self._initializers.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    @cached_property
    def made_in_kernel(self) -> frozenset[str]:
        """The constants a kernel holds without reading them: one element (an immediate) or a
        band of a matrix it writes from bounds (importer/bands.py). Only the initializers that
        could be a band by their shape and type are converted to be looked at."""
        return frozenset(name for name, tensor in self._initializers.items()
                         if could_be_in_source(tuple(tensor.dims), tensor.data_type)
                         and in_source(self.constant(name)))

    def _shape_text(self, name: str) -> list[int] | str:
        info = self.tensors.get(name)
        return "symbolic" if info is None or info.shape is None else list(info.shape)

    def summary(self) -> dict[str, Any]:
        """Plain figures for printing and ``--json``."""
        ops: dict[str, int] = {}
        for node in self.nodes:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        return {
            "opset": self.opset,
            "nodes_in_source": self.stats.nodes_in_source,
            "nodes_after_folding": self.stats.nodes_after_folding,
            "nodes": len(self.nodes),
            "in_scope": sum(node.in_scope for node in self.nodes),
            "inputs": {name: self._shape_text(name) for name in self.inputs},
            "outputs": {name: self._shape_text(name) for name in self.outputs},
            "symbolic": list(self.symbolic),
            "shapes_corrected": list(self.stats.shapes_corrected),
            "ops": dict(sorted(ops.items())),
            "import_seconds": round(self.stats.seconds, 3),
            **({"quantised": dict(self.stats.quantised)} if self.stats.quantised else {}),
        }
