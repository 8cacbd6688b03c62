"""No target's kernels take int64: a kernel holds an int64 tensor as int32, narrowed at its
boundary (fusion/classify.kernel_dtype), so a transformer's int64 attention mask joins its
region instead of keeping it unfused; an int64 constant beyond int32 keeps its op out."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import assert_compiled_matches, fuse
from tests.onnx_builders import GraphBuilder


def bert_mask(limit: int = 1):
    """BERT's extended attention mask from an int64 [B, S] mask: (1 - mask) * -10000, as a
    float, broadcast over the heads and queries; and whether each position is within ``limit``
    (an int64 comparison)."""
    b = GraphBuilder()
    mask = b.input("attention_mask", [1, 16], onnx.TensorProto.INT64)
    expanded = b.op("Unsqueeze", [mask], axes=[1, 2])
    valid = b.op("Cast", [b.op("LessOrEqual", [expanded, b.const(np.int64(limit))])],
                 to=onnx.TensorProto.FLOAT)
    inverted = b.op("Sub", [b.const(np.float32(1.0)), b.op("Cast", [expanded],
                                                              to=onnx.TensorProto.FLOAT)])
    return b.model(b.op("Mul", [b.op("Mul", [inverted, b.const(np.float32(-10000.0))]), valid]))


@pytest.mark.pypto
def test_an_int64_attention_mask_is_one_kernel_holding_it_as_int32(tmp_path):
    graph, plan = fuse(bert_mask())
    assert plan.totals.kernels_after == 1, plan.unfused
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, (kernel.fallback_reason, kernel.verdicts)
    assert "pypto.DT_INT32" in kernel.source and "DT_INT64" not in kernel.source
    # the lower bound counts the int64 mask at the 4 bytes a kernel moves it in, the 16
    # fp32 output at 4: the kernel measures no fewer (asr_frontend_kaldi's int64 index
    # arithmetic measured half its bound when it counted 8; bench.compare flagged it)
    (region,) = plan.regions
    assert region.fused.gm_bytes == 16 * 4 + 16 * 4
    assert kernel.gm_bytes_read + kernel.gm_bytes_written >= region.fused.gm_bytes
    assert_compiled_matches(graph, plan)


def test_an_int64_constant_beyond_int32_keeps_its_op_out():
    graph, plan = fuse(bert_mask(limit=2**40))
    (reason,) = [u.reason for u in plan.unfused if u.op_type == "LessOrEqual"]
    assert "beyond int32" in reason, reason
