"""Issue 37's convolutions inside kernels (importer/contractions.py,
pypto_kernels/codegen/convolution.py): a depthwise KxK Conv (stride and dilation up to 2, any
padding) is a window op the kernel writes as its taps; any other KxK Conv (one group, or a few
with block-diagonal weights) is a matmul root the cube computes from its taps' columns. Each
fuses its epilogue, compiles with the real PyPTO 0.2.0 and passes its check against
onnxruntime, in fp32 and fp16. A convolution no lowering takes (a 7x7 window, more than 8
groups that are not depthwise) stays a boundary with its reason, and one whose kernel would
stage more through GM than fusing saves stays out as not paying
(fusion/cost.why_staging_does_not_pay). Small shapes: a few seconds of compile each."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import pypto_offline
from pypto_offline.registry.ops import MATMUL, WINDOW, kind_of
from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.runtime import generate_inputs, max_abs_diff, run_model
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

RNG = np.random.default_rng(37)


def _conv(channels=8, size=16, kernel=3, stride=1, dilation=1, activation="HardSwish",
          dtype=np.float32, bias=True, groups=None, filters=None):
    """A Conv of ``groups`` groups (default: depthwise, one per channel) and its activation."""
    groups = groups or channels
    filters = filters or channels
    b = GraphBuilder()
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = b.input("x", [1, channels, size, size], elem)
    shape = (filters, channels // groups, kernel, kernel)
    inputs = [x, b.const(RNG.standard_normal(shape) * 0.3, dtype)]
    if bias:
        inputs.append(b.const(RNG.standard_normal(filters) * 0.3, dtype))
    pad = dilation * (kernel - 1) // 2
    conv = b.op("Conv", inputs, group=groups, kernel_shape=[kernel, kernel],
                strides=[stride, stride], dilations=[dilation, dilation], pads=[pad] * 4)
    return b.model(b.op(activation, [conv]) if activation else conv)


DEPTHWISE = {
    "depthwise 3x3 s1, bias, HardSwish": dict(),
    "depthwise 3x3 s2, bias, Relu": dict(stride=2, activation="Relu"),
    "depthwise 3x3 dilation 2, HardSwish": dict(dilation=2, bias=False),
    "depthwise 5x5 s1, bias, Relu": dict(kernel=5, activation="Relu"),
    "depthwise 3x3 s1, bias, Relu, fp16": dict(activation="Relu", dtype=np.float16),
    "depthwise 3x3 s2 on an odd image, HardSwish, fp16": dict(stride=2, size=15,
                                                              dtype=np.float16),
    "depthwise 3x3 dilation 2, HardSwish, fp16": dict(dilation=2, bias=False, dtype=np.float16),
}
ON_THE_CUBE = {
    # 8x8 in fp32: at 16x16 the taps' columns stage more than fusing saves (fp16 halves them)
    "3x3 16->32, bias, Relu": dict(groups=1, channels=16, filters=32, activation="Relu",
                                   size=8),
    "3x3 16->32, bias, Relu, fp16": dict(groups=1, channels=16, filters=32, activation="Relu",
                                         dtype=np.float16),
    "3x3 s2 8->16, HardSwish": dict(groups=1, filters=16, stride=2, bias=False),
    "3x3 in 4 groups 16->32, bias, Relu": dict(groups=4, channels=16, filters=32,
                                               activation="Relu", size=8),
    "3x3 in 4 groups 16->32, bias, Relu, fp16": dict(groups=4, channels=16, filters=32,
                                                     activation="Relu", dtype=np.float16),
}
CASES = {**DEPTHWISE, **ON_THE_CUBE}


def test_a_convolution_is_a_window_op_or_a_matmul_root_fused_with_its_activation():
    for name, case in CASES.items():
        graph, plan = fuse(_conv(**case))
        (region,) = plan.regions
        assert [op.op_type for op in region.original] == ["Conv", case.get("activation",
                                                                             "HardSwish")], name
        (conv,) = [node for node in graph.nodes if node.op_type == "Conv"]
        assert kind_of(conv.op_type, conv.params) == (WINDOW if name in DEPTHWISE else MATMUL)
        assert plan.totals.kernels_after == 1 and not plan.unfused, name


@pytest.mark.parametrize("case, reason", [
    (dict(kernel=7), "kernel_shape [7, 7]: at most 5"),
    (dict(groups=16, channels=32), "16 groups of 32 channels, not depthwise: at most 8"),
    # its taps' columns, 64 x 9 x 64 x 64 floats, written and read again: 18.9 MB through GM
    (dict(groups=1, channels=64, filters=64, size=64), "through GM")])
def test_a_convolution_no_lowering_takes_or_that_does_not_pay_stays_out_with_its_reason(
        case, reason):
    graph, plan = fuse(_conv(**case))
    (conv,) = [u for u in plan.unfused if u.op_type == "Conv"]
    assert reason in conv.reason, conv.reason


def _one_kernel_that_checks(model, folder, tolerance: float, target: str = "kirin9050"):
    """The model's one region compiled (default tile) and passing its check, and the compiled
    graph (the region as its ONNX function) computing what the model does within
    ``tolerance`` of its largest output value; the kernel."""
    graph, plan = fuse(model, target=target)
    (kernel,) = compile_kernels(graph, plan, TARGETS[target], cache_dir=folder, search=False)
    assert kernel.compiled and kernel.functional_ok, kernel.fallback_reason
    feeds = generate_inputs(model, seed=1)
    expected, actual = run_model(model, feeds), run_model(plan.compiled_model, feeds)
    for output, want in expected.items():
        assert max_abs_diff(want, actual[output]) <= tolerance * max(1.0, np.abs(want).max())
    return kernel


@pytest.mark.pypto
@pytest.mark.parametrize("name", list(CASES))
def test_a_convolution_and_its_epilogue_compile_to_one_kernel_that_checks(name, tmp_path):
    kernel = _one_kernel_that_checks(_conv(**CASES[name]), tmp_path, 1e-3)
    assert kernel.tuned_tile.ub_bytes <= TARGETS["kirin9050"].ub_plan_bytes.value


def test_the_compare_table_shows_each_convolution_kernel_against_its_lower_bound():
    """bench.compare's per-kernel figure (issue 37's must-show): a shipped kernel holding a
    windowed Conv is listed with its GM bytes and lower bound, a 1x1 one (a matmul) and a
    fallen-back one are not, and the table's cell gives the count and the spread."""
    import json

    from bench.compare import convolution_cell
    from bench.corpus_build import convolution_kernels
    from pypto_offline.offline_compiler import ptom_pb2

    def kernel(name, params, compiled=True, moved=3000):
        conv = ptom_pb2.Op(op_type="Conv", params_json=json.dumps(params, sort_keys=True))
        relu = ptom_pb2.Op(op_type="Relu")
        return ptom_pb2.Kernel(id=name, compiled=compiled, original=[conv, relu],
                               simplified=[conv, relu], gm_bytes_read=moved // 2,
                               gm_bytes_written=moved - moved // 2, gm_bytes_lower_bound=1000)

    shipped = [k for k in (kernel("dw", {"kernel_shape": [3, 3], "group": 8}),
                           kernel("cube", {"kernel_shape": [3, 3], "group": 1}, moved=1500),
                           kernel("pointwise", {}),
                           kernel("fell_back", {"kernel_shape": [3, 3]}, compiled=False))
               if k.compiled]
    rows = convolution_kernels(shipped)
    assert [(r["id"], r["gm_bytes"], r["gm_bytes_lower_bound"], r["windows"]) for r in rows] \
        == [("dw", 3000, 1000, [[3, 3]]), ("cube", 1500, 1000, [[3, 3]])]
    assert convolution_cell({"shipped": {"convolutions": rows}}) == "2: 1.50x / 2.25x / 3.00x"
    assert convolution_cell({"shipped": {"convolutions": []}}) == "0"
    assert convolution_cell({}) == "—"


def test_a_reduction_joins_a_convolution_s_planes_but_not_a_matmul_s_rows():
    """A convolution's epilogue may reduce each channel's plane (``fusion/rows._conv_planes``:
    the cube's product rows are the reduction's rows), a MatMul's epilogue no reduction (a
    region holds one root and, beside a MatMul, no reduction: unchanged), and a reduction over
    other rows than the convolution's planes is refused."""
    def pooled(conv: bool, axes=(2, 3)):
        b = GraphBuilder()
        if conv:
            x = b.input("x", [1, 16, 8, 8])
            product = b.op("Conv", [x, b.const(RNG.standard_normal((32, 16, 1, 1)) * 0.3)])
        else:
            x = b.input("x", [1, 32, 64])
            product = b.op("MatMul", [x, b.const(RNG.standard_normal((64, 64)) * 0.3)])
        activated = b.op("Relu", [product])
        reduced = b.op("ReduceMean", [activated, b.const(list(axes))], keepdims=1)
        return b.model(b.op("Sigmoid", [reduced]))

    def runs(model):
        return sorted(tuple(op.op_type for op in r.original) for r in fuse(model)[1].regions)

    assert runs(pooled(conv=True)) == [("Conv", "Relu", "ReduceMean", "Sigmoid")]
    assert runs(pooled(conv=False, axes=(2,))) == [("MatMul", "Relu"), ("ReduceMean", "Sigmoid")]
    assert ("Conv", "Relu", "ReduceMean", "Sigmoid") not in runs(pooled(conv=True, axes=(3,)))


def test_staging_is_costed_at_one_core_s_gm_port():
    """PyPTO's cost model moves a convolution's staging at about one core's GM port, not at
    the chip's bandwidth (docs/regions.md, "Whether it pays"): the inverted residual's
    depthwise 3x3 on 64 channels of 16x16 stays out, saying so; at 8x8 the block is one
    region."""
    from tests.test_mobile_blocks import mobilenet_v3_inverted_residual

    kirin = TARGETS["kirin9050"]
    assert kirin.seconds_for_bytes_on_one_core(15_000) == pytest.approx(1e-6)  # 15 B/cycle, 1 GHz
    assert kirin.seconds_for_bytes(50_000) == pytest.approx(1e-6)
    graph, plan = fuse(mobilenet_v3_inverted_residual(size=16))
    (depthwise,) = [u for u in plan.unfused if u.op_type == "Conv"]
    assert "one core's GM port" in depthwise.reason and "939008 B" in depthwise.reason
    assert len(fuse(mobilenet_v3_inverted_residual(size=8))[1].regions) == 1


def test_several_convolutions_share_a_region_only_around_a_reduction():
    """A squeeze-and-excite block's convolutions share the pooling's region, each product laid
    out in the pooling's rows (FULL), one value per row (ROW) or in its own rows (OWN); two
    1x1 convolutions in a row without a reduction stay a kernel each (a region holds one
    matmul), and so do two MatMuls around a reduction (only convolutions of one image)."""
    from pypto_offline.fusion.rows import FULL, OWN, ROW, row_layout
    from pypto_offline.pypto_kernels.codegen.layout import shapes_of
    from tests.test_mobile_blocks import mobilenet_v3_inverted_residual

    _, plan = fuse(mobilenet_v3_inverted_residual())
    (region,) = plan.regions
    rows = row_layout(region.simplified, shapes_of(region), region.outputs)
    assert (rows.rows, rows.columns) == (64, 64)
    products = [op.outputs[0] for op in region.simplified if op.op_type == "Conv"]
    assert [rows.kinds[p] for p in products] == [FULL, FULL, OWN, ROW, OWN]
    assert [rows.shape(p) for p in products] == [[64, 64], [64, 64], [16, 1], [64, 1],
                                                 [16, 64]]

    def chain(op_type: str, reduce: bool):
        b = GraphBuilder()
        if op_type == "Conv":
            x = b.input("x", [1, 16, 8, 8])
            weights = [RNG.standard_normal((16, 16, 1, 1)) * 0.3 for _ in range(2)]
        else:
            x = b.input("x", [1, 16, 64])
            weights = [RNG.standard_normal((64, 64)) * 0.3 for _ in range(2)]
        first = b.op("Relu", [b.op(op_type, [x, b.const(weights[0])])])
        if reduce:
            first = b.op("Mul", [first, b.op("ReduceMean", [first, b.const([-1])], keepdims=1)])
        return b.model(b.op(op_type, [first, b.const(weights[1])]))

    def regions(model):
        return [[op.op_type for op in r.original] for r in fuse(model)[1].regions]

    assert regions(chain("Conv", reduce=False)) == [["Conv", "Relu"]]
    assert all(r.count("MatMul") <= 1 for r in regions(chain("MatMul", reduce=True)))


def lcnet_squeeze_excite(channels=32, height=6, width=96, projected=None):
    """ppocr_cls_v2's PP-LCNet block from its depthwise convolution's product on (a convolution
    whose staging does not pay stays out, so its product comes from GM): the bias and HardSwish,
    the squeeze-and-excite (pooling, 1x1 convolution, Relu, 1x1 convolution, HardSigmoid), the
    gate's Mul, and the 1x1 projection (to ``projected`` channels, default ``channels``) with its
    bias and HardSwish."""
    b = GraphBuilder()
    x = b.input("x", [1, channels, height, width])

    def conv(image, filters, inputs):
        weights = RNG.standard_normal((filters, inputs, 1, 1)) * 0.3
        bias = RNG.standard_normal((1, filters, 1, 1)) * 0.3
        return b.op("Add", [b.op("Conv", [image, b.const(weights)]), b.const(bias)])

    activated = b.op("HardSwish", [b.op("Add", [x, b.const(
        RNG.standard_normal((1, channels, 1, 1)) * 0.3)])])
    squeezed = b.op("Relu", [conv(b.op("GlobalAveragePool", [activated]), channels // 4,
                                  channels)])
    gate = b.op("HardSigmoid", [conv(squeezed, channels, channels // 4)], alpha=1 / 6, beta=0.5)
    excited = b.op("Mul", [activated, gate])
    return b.model(b.op("HardSwish", [conv(excited, projected or channels, channels)]))


LCNET_SQUEEZE_EXCITE = ["Add", "HardSwish", "GlobalAveragePool", "Conv", "Add", "Relu", "Conv",
                        "Add", "HardSigmoid", "Mul", "Conv", "Add", "HardSwish"]


def test_an_excitation_of_a_pooling_in_the_region_joins_it():
    """A squeeze-and-excite whose image comes from GM (PP-LCNet's, after a depthwise
    convolution left to its own kernel): the excitation's first 1x1 convolution reads the
    pooling made in the region, and joins it (``partition._matmul_is_root``: a convolution's
    operand made in the region only with a reduction among the members, as for several), so
    the block is one region where it was four (bias+HardSwish+pooling, squeeze, excite+gate,
    projection). A MatMul whose operand the region makes still does not join. A projection
    to other channels than the image's is a product in its own rows (OWN), and its per-channel
    bias one value per row of them (OWN_ROW, ``rows._per_channel_of_own``): before, that bias
    was not laid out, and the bias and activation stayed a kernel of their own."""
    from pypto_offline.fusion.rows import OWN, OWN_ROW, row_layout
    from pypto_offline.pypto_kernels.codegen.layout import shapes_of

    for projected in (None, 64):
        graph, plan = fuse(lcnet_squeeze_excite(projected=projected))
        assert [[op.op_type for op in r.original] for r in plan.regions] == [
            LCNET_SQUEEZE_EXCITE], projected
        assert not plan.unfused and plan.totals.kernels_after == 1
    (region,) = plan.regions
    rows = row_layout(region.simplified, shapes_of(region), region.outputs)
    (projection, bias) = region.simplified[-2].inputs  # the projection's Add
    assert (rows.kinds[projection], rows.shape(projection)) == (OWN, [64, 6 * 96])
    assert (rows.kinds[bias], rows.shape(bias)) == (OWN_ROW, [64, 1])

    b = GraphBuilder()
    x = b.input("x", [1, 32, 64])
    pooled = b.op("ReduceMean", [b.op("Relu", [x]), b.const([1])], keepdims=1)
    b_model = b.model(b.op("MatMul", [pooled, b.const(RNG.standard_normal((64, 16)) * 0.3)]))
    assert all(r.count("MatMul") == 0 or r == ["MatMul"] for r in
               [[op.op_type for op in r.original] for r in fuse(b_model)[1].regions])


@pytest.mark.pypto
def test_a_squeeze_excite_from_gm_compiles_to_one_kernel_that_checks(tmp_path):
    """The PP-LCNet block above (16 channels of 6x24: a few seconds of compile): one kernel
    that passes its check, and the compiled graph computes what the model does."""
    kernel = _one_kernel_that_checks(lcnet_squeeze_excite(16, 6, 24), tmp_path, 1e-4)
    assert kernel.source.count("pypto.matmul(") == 3


def activated_pointwise_conv(channels=16, height=6, width=24, filters=32, kernel=1):
    """PP-LCNetV3's block after its depthwise convolution (which stays out): the BatchNorm's
    scale and shift and HardSwish on its product, then a ``kernel``-square convolution with its
    bias and HardSwish."""
    b = GraphBuilder()
    x = b.input("x", [1, channels, height, width])

    def per_channel(count):
        return b.const(RNG.standard_normal((1, count, 1, 1)) * 0.3)

    activated = b.op("HardSwish", [b.op("Add", [b.op("Mul", [x, per_channel(channels)]),
                                                per_channel(channels)])])
    weights = RNG.standard_normal((filters, channels, kernel, kernel)) * 0.3
    conv = b.op("Conv", [activated, b.const(weights)], pads=[kernel // 2] * 4)
    return b.model(b.op("HardSwish", [b.op("Add", [conv, per_channel(filters)])]))


def test_an_elementwise_prologue_joins_a_pointwise_convolution():
    """The elementwise ops making a 1x1 convolution's image join its region
    (``partition._elementwise_around_a_pointwise_conv``): one kernel where there were two. A
    3x3 convolution's image made in the region (its taps would view a tensor the kernel
    writes) and a MatMul's left operand still come from outside."""
    _, plan = fuse(activated_pointwise_conv())
    assert [[op.op_type for op in r.original] for r in plan.regions] == [
        ["Mul", "Add", "HardSwish", "Conv", "Add", "HardSwish"]]
    _, plan = fuse(activated_pointwise_conv(height=4, width=4, kernel=3))
    assert ["Mul", "Add", "HardSwish"] in [[op.op_type for op in r.original]
                                           for r in plan.regions]

    b = GraphBuilder()  # weights the region makes: not a convolution's image
    x = b.input("x", [1, 16, 6, 24])
    weights = b.op("Relu", [b.input("w", [32, 16, 1, 1])])
    model = b.model(b.op("Relu", [b.op("Conv", [b.op("Relu", [x]), weights])]))
    _, plan = fuse(model)
    assert [[op.op_type for op in r.original] for r in plan.regions] == [["Relu", "Conv", "Relu"]]
    assert [u.op_type for u in plan.unfused] == ["Relu"]  # the weights'

    b = GraphBuilder()
    x = b.input("x", [1, 32, 64])
    activated = b.op("Relu", [b.op("Mul", [x, b.const(np.float32(2))])])
    model = b.model(b.op("MatMul", [activated, b.const(RNG.standard_normal((64, 16)) * 0.3)]))
    assert [[op.op_type for op in r.original] for r in fuse(model)[1].regions] == [
        ["Mul", "Relu"]]


@pytest.mark.pypto
def test_an_elementwise_prologue_and_its_pointwise_convolution_compile_and_check(tmp_path):
    """The block above: one kernel that passes its check (19.8 us at its default tile against
    2.9 + 7.6 for the two it was, a launch fewer; at 128 channels of 12x160, 326.7 us and
    5.97 MB against 173.9 + 167.4 us and 6.04 MB), and the compiled graph computes what the
    model does."""
    _one_kernel_that_checks(activated_pointwise_conv(), tmp_path, 1e-4)


def test_an_input_cast_read_by_a_block_and_its_residual_joins_the_block():
    """Under force_fp16 the model input's Cast feeds the block's first convolution and its
    residual Add: refused at first (with the block not yet one region, the merge made a
    cycle), then tried again once the block and the Add are one (``Partition._grow``)."""
    from pypto_offline import import_model
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.importer.precision import FORCE_FP16, to_half
    from tests.test_mobile_blocks import mobilenet_v3_inverted_residual

    half, _ = to_half(import_model(mobilenet_v3_inverted_residual()).model, FORCE_FP16)
    plan = plan_fusion(import_model(half), TARGETS["kirin9050"])
    (region,) = plan.regions
    assert [op.op_type for op in region.original].count("Cast") == 2 and not plan.unfused


def _lcnet_downsampling(channels=8, height=24, width=96):
    """PP-LCNet's downsampling (ppocr_cls_v2's second block, its shapes): a 1x1 convolution
    and HardSwish, then a depthwise 3x3 of stride (2, 1) and HardSwish."""
    b = GraphBuilder()
    x = b.input("x", [1, channels, height, width])
    pointwise = b.op("Conv", [x, b.const(RNG.standard_normal((channels, channels, 1, 1)) * 0.3),
                              b.const(RNG.standard_normal(channels) * 0.3)])
    depthwise = b.op("Conv", [b.op("HardSwish", [pointwise]),
                              b.const(RNG.standard_normal((channels, 1, 3, 3)) * 0.3),
                              b.const(RNG.standard_normal(channels) * 0.3)],
                     group=channels, kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1])
    return b.model(b.op("HardSwish", [depthwise]))


def test_a_strided_convolution_reads_stride_phases_once_its_taps_read_enough():
    """A strided convolution whose taps read at least ``STRIDE_PHASES_FROM_BYTES`` views the
    padded image's stride phases (codegen/convolution._StridePhases), each tap its output's
    extent, and is costed so: PP-LCNet's depthwise (2, 1) on 8x24x96 was estimated to stage
    969,856 B and stayed out on kirin90; now 828,800 B, and its block is one region. A small
    one keeps the stride-1 span (the phases' steps cost it more time than they save)."""
    from pypto_offline.fusion.cost import reads_stride_phases

    params = {"kernel_shape": [3, 3], "strides": [2, 1]}
    assert reads_stride_phases(params, 8, [1, 8, 12, 96], 4)  # 331,776 B of taps' reads
    assert not reads_stride_phases(params, 8, [1, 8, 8, 8], 4)
    assert not reads_stride_phases({**params, "strides": [1, 1]}, 8, [1, 8, 12, 96], 4)
    graph, plan = fuse(_lcnet_downsampling(), target="kirin90")
    assert [[op.op_type for op in r.original] for r in plan.regions] \
        == [["Conv", "HardSwish", "Conv", "HardSwish"]] and not plan.unfused
    _, on_kirin9050 = fuse(_lcnet_downsampling())
    (depthwise,) = [u for u in on_kirin9050.unfused if u.op_type == "Conv"]
    assert "stage 828800 B" in depthwise.reason, depthwise.reason


@pytest.fixture(scope="module")
def lcnet_cache(tmp_path_factory):
    """One kernel cache for the tests that compile the PP-LCNet block: its kernel compiles
    once."""
    return tmp_path_factory.mktemp("lcnet") / "cache"


@pytest.mark.pypto
def test_a_convolution_on_stride_phases_compiles_and_checks(lcnet_cache):
    """The PP-LCNet downsampling block on kirin90, its depthwise convolution on the rows'
    phases (a reshape and a view each, no gather): one kernel that passes its check, and the
    compiled graph computes what the model does. Measured alone on kirin9050 (the
    depthwise (2, 1) and its ReLU): 1.41 MB in 104.6 us as per-tap strided views, 0.83 MB in
    73.1 us on phases (docs/pypto-ops.md, "Strided convolutions")."""
    kernel = _one_kernel_that_checks(_lcnet_downsampling(), lcnet_cache, 1e-3, "kirin90")
    assert "index_select" not in kernel.source and "pypto.reshape(t" in kernel.source


@pytest.mark.pypto
def test_a_kernel_that_moves_more_than_its_ops_ships_only_if_pypto_times_it_faster(
        lcnet_cache):
    """Issue 53: fusion never ships more bytes on an estimate. The PP-LCNet block's kernel at
    its default tile stages 977,376 B where its four ops unfused move 479,840: the build
    measures its ops alone (an estimate is not evidence enough) and drops it, slower than they
    are; each part of its cuts the same, so the build moves no more than its ops."""
    compiled = pypto_offline.compile(_lcnet_downsampling(), "kirin90", cache_dir=lcnet_cache,
                                     tile_search=False, verify=True)
    kernels = {k.id: k for k in compiled.message.kernels}
    block = kernels["region_0"]
    assert block.gm_bytes_read + block.gm_bytes_written > block.gm_bytes_unfused
    assert not block.compiled and block.fallback_category == "slower fused"
    assert block.fallback_reason.endswith("(measured)"), block.fallback_reason
    assert all(not k.compiled and k.fallback_reason.endswith("(measured)")
               for k in kernels.values()), [k.fallback_reason for k in kernels.values()]
    totals = compiled.message.totals
    assert totals.gm_bytes_after <= totals.gm_bytes_before
    assert compiled.summary()["verification"]["status"] == "passed"
