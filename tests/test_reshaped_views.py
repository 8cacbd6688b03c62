"""A view reshaped in a kernel: PyPTO 0.2.0 copies it element by element (docs/compile-time.md,
"Reshaped views"), which made nudenet's YOLO head (a Split output reshaped, then transposed)
never compile within the 300 s limit. The generator copies such a view with ``clone`` first."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from pypto_offline.pypto_kernels import compile_region, setup_for
from pypto_offline.pypto_kernels.codegen import kernel_source
from pypto_offline.pypto_kernels.search import largest_tensor_bytes
from pypto_offline.pypto_kernels.tiling import candidate_policies
from pypto_offline.pypto_kernels.program_figures import TILE_GRAPH
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

TARGET = TARGETS["kirin9050"]
# nudenet: 64 box and 18 class channels on 2100 anchors, one 1x1x2104 tile per row at the default
# budget; here 8 x 1089, still one row per tile (1089 floats are more than half of 8 KiB)
BOXES, CLASSES, SIDE = 8, 2, 33


def yolo_head():
    """nudenet's head in small: Concat of box and class maps, Reshape, Split back into boxes and
    classes, Sigmoid of the classes, the boxes reshaped to 4 x 4 and transposed."""
    b = GraphBuilder()
    boxes = b.input("boxes", [1, BOXES, SIDE, SIDE])
    classes = b.input("classes", [1, CLASSES, SIDE, SIDE])
    joined = b.op("Concat", [boxes, classes], axis=1)
    flat = b.op("Reshape", [joined], shape=[1, BOXES + CLASSES, SIDE * SIDE])
    box, cls = b.op("Split", [flat], outputs=2, split=[BOXES, CLASSES], axis=1)
    grid = b.op("Reshape", [box], shape=[1, 4, BOXES // 4, SIDE * SIDE])
    return b.model(b.op("Sigmoid", [cls]), b.op("Transpose", [grid], perm=[0, 2, 1, 3]))


@pytest.fixture(scope="module")
def head():
    graph, plan = fuse(yolo_head())
    (region,) = plan.regions
    assert {"Split", "Reshape", "Transpose"} <= {op.op_type for op in region.simplified}
    return graph, region


def reshaped_views(source: str) -> list[str]:
    """The variables made by ``pypto.view`` that the kernel passes to ``pypto.reshape``."""
    views = set(re.findall(r"^\s*(\w+) = pypto\.view\(", source, re.M))
    reshaped = re.findall(r"pypto\.reshape\((\w+),", source)
    return [name for name in reshaped if name in views]


def test_no_tile_candidate_reshapes_a_view(head):
    graph, region = head
    policies = candidate_policies(TARGET.ub_plan_bytes.value, largest_tensor_bytes(region))
    for policy in policies:
        source = kernel_source(region, policy, graph.constant_values())
        assert "pypto.clone(" in source, policy
        assert reshaped_views(source) == [], (policy, source)


@pytest.mark.pypto
def test_the_head_compiles_with_copies_per_tile_not_per_element(head, tmp_path):
    """Real PyPTO: with the view reshaped directly, the compiled program held 1636 COPY_IN for
    the 1600 elements of the reshaped view (and nudenet's 134,400 never compiled); with the
    clone, a few per tile."""
    graph, region = head
    kernel = compile_region(region, graph, setup_for(TARGET, tmp_path, timeout=120),
                            graph.constant_values(), search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    program = json.loads(gzip.decompress(kernel.artifacts["program.json.gz"]))
    copies_in = sum(op.get("opcode") == "COPY_IN" for function in program["functions"]
                    if function.get("graphtype") == TILE_GRAPH for op in function["operations"])
    assert 0 < copies_in < BOXES * SIDE * SIDE // 10, copies_in
