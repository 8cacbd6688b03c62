"""Figures that cannot be wrong (docs/figures.md): GM bytes counted from the compiled program never
fall below the lower bound, a missing figure reads "not measured" (never 0), an infinite one
renders, and equal infinities (an attention mask's -inf) pass the functional check."""
from __future__ import annotations

import gzip
import importlib
import json
import sys

import numpy as np
import pytest

from pypto_offline import api, cli
from pypto_offline.offline_compiler import blob
from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.pypto_kernels.program_figures import copy_traffic
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

NOT_MEASURED = "not measured"


def masked_scores():
    """An attention-style masked score: Add(x, mask) scaled, where the mask (an initializer, as
    the functional check seeds only runtime inputs) holds -inf above the diagonal; the region's
    output keeps those -inf."""
    b = GraphBuilder()
    x = b.input("x", [1, 2, 16, 16])
    mask = np.triu(np.full((16, 16), -np.inf, np.float32), k=1).reshape(1, 1, 16, 16)
    masked = b.op("Add", [x, b.const(np.broadcast_to(mask, (1, 2, 16, 16)).copy())])
    return b.model(b.op("Mul", [masked, b.const(np.float32(0.125))]))


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """The masked model compiled and verified, its blob saved (one cold build for the module)."""
    folder = tmp_path_factory.mktemp("masked")
    compiled = api.compile(masked_scores(), "kirin9050", cache_dir=folder / "cache",
                           tile_search=False)
    compiled.verify()
    return compiled, compiled.save(folder / "masked.ptom"), folder


@pytest.mark.pypto
def test_a_region_whose_output_holds_minus_inf_fuses_and_verifies(masked):
    compiled, _, _ = masked
    (kernel,) = compiled.message.kernels
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert kernel.max_abs_diff == 0.0
    assert [op.op_type for op in kernel.original] == ["Add", "Mul"]
    assert compiled.summary()["verification"]["status"] == "passed"


@pytest.mark.pypto
def test_a_one_element_constant_is_no_part_of_the_lower_bound(masked):
    """The kernel holds the 0.125 scale as an immediate: x, the mask and the output are all it
    must move, and it measures no less."""
    compiled, _, _ = masked
    (kernel,) = compiled.message.kernels
    assert kernel.gm_bytes_lower_bound == 3 * 2 * 16 * 16 * 4
    assert kernel.gm_bytes_read + kernel.gm_bytes_written >= kernel.gm_bytes_lower_bound


def _run_cli(argv, capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def unmeasured_baseline(masked):
    """The same model rebuilt (kernels from the cache) where no region's unfused baseline could
    be measured, as when each op's own kernel fails to compile."""
    _, _, folder = masked
    build_module = importlib.import_module("pypto_offline.offline_compiler.build")
    with pytest.MonkeyPatch.context() as patch:  # our baseline step, not PyPTO
        patch.setattr(build_module, "unfused_costs",
                      lambda graph, regions, *a, **k: {r.id: None for r in regions})
        compiled = api.compile(masked_scores(), "kirin9050", cache_dir=folder / "cache",
                               tile_search=False, measure_baseline=True)
    assert compiled.kernel_cache["compiled"] == 0  # the kernel itself came from the cache
    compiled.verify()
    return compiled.save(folder / "unmeasured.ptom")


@pytest.mark.pypto
def test_an_unmeasured_baseline_is_null_in_json_not_zero(unmeasured_baseline, capsys):
    code, out = _run_cli(["inspect", str(unmeasured_baseline), "--json"], capsys)
    assert code == 0
    pypto = json.loads(out)["pypto"]
    assert pypto["cost_us_fused"] is None and pypto["cost_us_unfused"] is None
    assert pypto["compiled"] == 1 and pypto["kernels_cost_compared"] == 0


@pytest.mark.pypto
def test_an_unmeasured_baseline_reads_not_measured_in_the_human_summary(unmeasured_baseline,
                                                                         capsys):
    code, out = _run_cli(["inspect", str(unmeasured_baseline)], capsys)
    assert code == 0
    (line,) = [line for line in out.splitlines() if "PyPTO:" in line]
    assert "cost model not measured" in line and "0.0 µs" not in line


@pytest.mark.pypto
def test_an_unmeasured_baseline_reads_not_measured_in_the_report(unmeasured_baseline, tmp_path,
                                                                 capsys):
    code, _ = _run_cli(["report", str(unmeasured_baseline), "-o", str(tmp_path / "r.html")],
                       capsys)
    assert code == 0
    page = (tmp_path / "r.html").read_text()
    for key in ("pypto.cost_us_fused", "pypto.cost_us_unfused"):
        assert f'data-key="{key}" data-value="null">{NOT_MEASURED}</td>' in page, key


def _edited_blob(masked, path, edit):
    compiled, _, _ = masked
    message = type(compiled.message)()
    message.CopyFrom(compiled.message)
    edit(message)
    return blob.write(path, message)


@pytest.mark.pypto
def test_inspect_and_report_show_infinite_figures_as_inf(masked, tmp_path, capsys):
    def infinite(message):
        message.verification.status = "failed"
        for output in message.verification.outputs:  # as api.verify records an infinite diff
            output.max_abs_diff = output.max_rel_diff = sys.float_info.max
        kernel = message.kernels[0]
        kernel.compiled = True  # shown with its tiles whatever the check said
        kernel.max_abs_diff = float("inf")
        kernel.tuned_tile.aicore_us = kernel.default_tile.total_us = float("inf")

    path = _edited_blob(masked, tmp_path / "inf.ptom", infinite)
    code, out = _run_cli(["inspect", str(path)], capsys)
    assert code == 0 and "max abs diff inf" in out and "inf tuned" in out
    code, _ = _run_cli(["report", str(path), "-o", str(tmp_path / "r.html")], capsys)
    assert code == 0
    page = (tmp_path / "r.html").read_text()
    assert 'data-key="verification.max_abs_diff"' in page
    assert "(max abs diff against onnxruntime inf)" in page
    assert '<td class="num" data-tile="tuned">inf</td>' in page


@pytest.mark.pypto
def test_inspect_and_report_show_absent_figures_as_not_measured(masked, tmp_path, capsys):
    def absent(message):
        del message.verification.outputs[:]  # a check that compared no output
        kernel = message.kernels[0]
        kernel.ClearField("max_abs_diff")
        kernel.default_tile.ClearField("aicore_us")

    path = _edited_blob(masked, tmp_path / "none.ptom", absent)
    code, out = _run_cli(["inspect", str(path)], capsys)
    assert code == 0
    assert f"max abs diff {NOT_MEASURED}" in out and f"{NOT_MEASURED} default" in out
    code, out = _run_cli(["inspect", str(path), "--json"], capsys)
    summary = json.loads(out)
    assert summary["verification"]["max_abs_diff"] is None
    assert summary["kernels"][0]["default_us"] is None
    code, _ = _run_cli(["report", str(path), "-o", str(tmp_path / "r.html")], capsys)
    assert code == 0
    page = (tmp_path / "r.html").read_text()
    assert f"(max abs diff against onnxruntime {NOT_MEASURED})" in page
    assert f'<td class="num" data-tile="default">{NOT_MEASURED}</td>' in page


def _program(gm_dtype: int, local_dtype: int, opcode: str) -> dict:
    """A one-copy tile graph in program.json's form: a [16, 16] tile of a GM tensor, its local
    side staged in another dtype (as an fp16 result staged in fp32)."""
    gm = {"magic": 1, "rawtensor": 10, "shape": [64, 16], "validshape": [64, 16],
          "mem_type": {"asis": 15, "tobe": 15}}
    local = {"magic": 2, "rawtensor": 20, "shape": [16, 16], "validshape": [16, 16],
             "mem_type": {"asis": 0, "tobe": 0}}
    ins, outs = ([1], [2]) if opcode == "COPY_IN" else ([2], [1])
    return {"functions": [{"graphtype": 1, "tensors": [gm, local],
                           "rawtensors": [{"rawmagic": 10, "datatype": gm_dtype},
                                          {"rawmagic": 20, "datatype": local_dtype}],
                           "operations": [{"opcode": opcode, "ioperands": ins,
                                           "ooperands": outs}]}]}


@pytest.mark.parametrize("opcode, side", [("COPY_OUT", "written"), ("COPY_IN", "read"),
                                          ("TRANSPOSE_MOVEOUT", "written")])
def test_copies_are_sized_by_the_gm_side_dtype(opcode, side):
    fp16, fp32 = 6, 7  # pypto DT_FP16, DT_FP32
    traffic = copy_traffic(_program(fp16, fp32, opcode))
    assert traffic[side] == 16 * 16 * 2 and sum(traffic.values()) == 16 * 16 * 2


def moveout_transpose():
    """Add then Transpose(0, 2, 1, 3) of the two middle axes as the region's output: PyPTO
    writes it to GM with TRANSPOSE_MOVEOUT, not COPY_OUT."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 4, 16])
    y = b.op("Add", [x, b.const(np.linspace(-1, 1, 16, dtype=np.float32))])
    return b.model(b.op("Transpose", [y], perm=[0, 2, 1, 3]))


def _opcodes(kernel) -> set[str]:
    program = json.loads(gzip.decompress(kernel.artifacts["program.json.gz"]))
    return {op["opcode"] for f in program["functions"] for op in f["operations"]}


@pytest.mark.pypto
def test_a_transpose_kernel_measures_at_least_its_lower_bound(tmp_path):
    graph, plan = fuse(moveout_transpose())
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert "TRANSPOSE_MOVEOUT" in _opcodes(kernel)
    assert kernel.gm_bytes >= plan.regions[0].fused.gm_bytes
    # PyPTO stages the sum in GM and reads it back for the transposing move-out: what is read
    # beyond the inputs was written beyond the output, once the move-out's writes are counted.
    inputs, output = 16 * 4 * 16 * 4 + 16 * 4, 4 * 16 * 16 * 4
    assert kernel.gm_bytes_read - inputs == kernel.gm_bytes_written - output > 0


@pytest.mark.pypto
def test_a_kernel_reading_a_slice_window_measures_at_least_its_lower_bound(tmp_path):
    """whisper's front end: transpose a spectrogram and drop its last frame. The kernel reads
    the frames it keeps only, so the bound must not count the dropped one."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 33])
    y = b.op("Slice", [b.op("Transpose", [x], perm=[0, 2, 1])], starts=[0], ends=[32], axes=[1])
    graph, plan = fuse(b.model(y))
    (region,) = plan.regions
    assert region.fused.gm_bytes == 2 * 32 * 16 * 4  # the 32 frames kept, read and written
    (kernel,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                                search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    assert kernel.gm_bytes >= region.fused.gm_bytes


@pytest.mark.pypto
@pytest.mark.parametrize("model, least_compiled, transposes_out, matmuls_alone", [
    ("tf_bert_encoder", 14, True, False), ("asr_frontend_whisper80_conv", 2, False, True)])
def test_no_kernel_of_a_corpus_model_measures_below_its_lower_bound(
        model, least_compiled, transposes_out, matmuls_alone, tmp_path):
    """BERT: Reshape+Transpose of Q/K/V (TRANSPOSE_MOVEOUT) after their matmuls, the attention
    mask made in each attention's kernel (14 kernels: the mask's own joined the cores, issue 54)
    and GELU with one-element constants (immediates in the kernel). whisper: a spectrogram
    transposed and sliced (the dropped frame is never read) and a Div by a constant; its mel
    filterbank matmul kept alone, as the build splits it (no tile of it fits Kirin's UB)."""
    from bench import corpus
    from pypto_offline import import_model
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.fusion.records import BOUNDARY

    spec = corpus.MODELS[model]
    graph = import_model(corpus.model_path(model), spec.input_shapes)
    alone = {n.outputs[0]: (BOUNDARY, "split by the build") for n in graph.nodes
             if matmuls_alone and n.op_type == "MatMul"}
    plan = plan_fusion(graph, TARGETS["kirin9050"], alone)
    kernels = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=tmp_path,
                              search=False)
    regions = {r.id: r for r in plan.regions}
    compiled = [k for k in kernels if k.compiled]
    assert len(compiled) >= least_compiled, [k.fallback_reason for k in kernels]
    assert transposes_out == any("TRANSPOSE_MOVEOUT" in _opcodes(k) for k in compiled)
    below = {k.region_id: (k.gm_bytes, regions[k.region_id].fused.gm_bytes) for k in compiled
             if k.gm_bytes < regions[k.region_id].fused.gm_bytes}
    assert below == {}


@pytest.mark.pypto
def test_the_bench_check_flags_a_kernel_below_its_lower_bound(masked):
    from pypto_offline.offline_compiler.summary import kernels_below_lower_bound

    compiled, _, _ = masked
    message = type(compiled.message)()
    message.CopyFrom(compiled.message)
    assert kernels_below_lower_bound(message) == []
    message.kernels[0].gm_bytes_written = 0
    assert kernels_below_lower_bound(message) == [message.kernels[0].id]
