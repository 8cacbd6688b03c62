"""Kirin phone NPUs (HarmonyOS CANN Kit): one coupled AI Core sharing LPDDR with the CPU.

Neither the NPU clock, the DRAM bandwidth the NPU sees, nor a launch cost is public
(docs/target-sources.md): those figures are estimates, marked as such.
"""
from pypto_offline.targets.descriptor import Figure, Target
from pypto_offline.targets.pypto_support import PYPTO_0_2_0

_KIRIN_DTYPES = Figure(("float16", "float32", "int8", "uint8", "int16", "int32", "bool"),
                       "HW-dt: no bf16, no fp8; Cast without s64")
_UB = Figure(131072, "RT kirin/*.ini ub_size")
_UB_PLAN = Figure(122880, "EST: plan with 120 KiB of the 128 KiB", estimate=True)
_LAUNCH = Figure(20.0, "EST: 10-30 us per task, mid-range", estimate=True)



_SHARED = dict(
    coupled=Figure(True, "RT kirin ini cube_vector_mix; HW-arch: 1 AI Core = 1 AIC + 1 AIV"),
    ai_cpus=Figure(0, "RT kirin ini ai_cpu_cnt= (empty: no AI CPU)"),
    clock_mhz=Figure(1000, "EST: not published; 1.0 GHz assumed", estimate=True),
    l2_bytes=Figure(0, "RT kirin ini l2_size=0 (system cache not modelled)"),
    ub_block_bytes=Figure(32, "RT kirin ini; PTO buffer_limits.hpp"),
    gm_atomics=Figure(False, "HW-atomic: SetAtomicAdd unsupported"),
    hw_cross_core_sync=Figure(False, "HW-sync: SyncAll emulated in software"),
    precision_mode=Figure("force_fp16", "ATC --precision_mode: force_fp16 for inference; HR "
                                        "atc_tools_guide.md: the phone's models are built by ATC"),
    cube_fp32=Figure(False, "HW-dt; PTO arch_capability.hpp: Mmad takes no float, acc fp16/int32"),
)


def _kirin(name: str, soc_version: Figure, npu_arch: Figure, ai_cores: Figure,
           bandwidth: Figure, notes: str = "", **details: Figure) -> Target:
    return Target(name=name, soc_version=soc_version, npu_arch=npu_arch, ai_cores=ai_cores,
                  ub_bytes=_UB, ub_plan_bytes=_UB_PLAN, gm_bandwidth_gbps=bandwidth,
                  launch_overhead_us=_LAUNCH, dtypes=_KIRIN_DTYPES, kernels=PYPTO_0_2_0,
                  notes=notes, **{**_SHARED, **details})


KIRIN90 = _kirin(
    "kirin90", Figure("KirinX90", "RT kirin/KirinX90.ini"), Figure(3003, "RT kirin/KirinX90.ini"),
    Figure(1, "RT kirin/KirinX90.ini"),
    Figure(80.0, "EST: 60-100 GB/s shared (GZ rumour)", estimate=True),
    cce_arch=Figure("dav-l300", "PY codegen_litenpu.cpp GetCoreArch"),
    aiv_cores=Figure(1, "RT kirin/KirinX90.ini vector_core_cnt"),
    l1_bytes=Figure(1048576, "RT kirin/KirinX90.ini"), l0a_bytes=Figure(65536, "RT ini"),
    l0b_bytes=Figure(65536, "RT ini"), l0c_bytes=Figure(131072, "RT ini"),
    vector_bytes_per_cycle=Figure(256, "EST: inferred from vec_calc_size=128 fp16",
                                  estimate=True),
    cube_mkn_fp16=Figure((16, 8, 16), "RT ini [AICoreSpec]"),
    gm_bytes_per_cycle_per_core=Figure(40, "EST: about 40 at 1 GHz", estimate=True),
    max_block_dim=Figure(1, "PY: PyPTO uses blockDim 1 on Kirin"),
    packaging=Figure("mobile OM (.omc), model_type 4, one launch per custom op, static shapes",
                     "GE ge_generator.cc IsMobile(); HR SobelCustom.omc"))

KIRIN9030 = _kirin(
    "kirin9030", Figure("Kirin9030", "RT kirin/Kirin9030.ini"),
    Figure(3113, "RT kirin/Kirin9030.ini"), Figure(1, "RT kirin/Kirin9030.ini"),
    Figure(50.0, "EST: 40-60 GB/s", estimate=True),
    cce_arch=Figure("dav-l311", "PY codegen_litenpu.cpp GetCoreArch"),
    aiv_cores=Figure(1, "RT kirin/Kirin9030.ini vector_core_cnt"),
    l1_bytes=Figure(524288, "RT kirin/Kirin9030.ini"), l0a_bytes=Figure(32768, "RT ini"),
    l0b_bytes=Figure(32768, "RT ini"), l0c_bytes=Figure(65536, "RT ini"),
    vector_bytes_per_cycle=Figure(256, "EST: inferred from vec_calc_size=128 fp16",
                                  estimate=True),
    cube_mkn_fp16=Figure((16, 8, 16), "RT ini [AICoreSpec]"),
    gm_bytes_per_cycle_per_core=Figure(40, "EST: about 40", estimate=True),
    max_block_dim=Figure(1, "PY: PyPTO uses blockDim 1 on Kirin"),
    packaging=Figure("mobile OM (.omc), model_type 4, one launch per custom op, static shapes",
                     "GE ge_generator.cc IsMobile()"))

KIRIN9050 = _kirin(
    "kirin9050",
    Figure("KirinDev0000", "inferred: asc-devkit issue lists Kirin 9050 with KirinDev0001-0003 "
           "(ADI; EST)", estimate=True),
    Figure(5101, "RT kirin-dev/KirinDev0000.ini"), Figure(4, "RT kirin-dev/KirinDev0000.ini"),
    Figure(50.0, "EST: unknown; taken as Kirin 9030's", estimate=True),
    notes="Kirin 9050 is taken to be KirinDev0000 (arch 5101): an inference, not a fact.",
    cce_arch=Figure("dav-l510", "RT kirin-dev/KirinDev0000.ini; mapping inferred"),
    aiv_cores=Figure(4, "RT kirin-dev/KirinDev0000.ini"),
    l1_bytes=Figure(1572864, "RT kirin-dev/KirinDev0000.ini"),
    # No L0A and no L0C on this chip: its cube reads the left operand from L1 and accumulates
    # in L1 (matmul_to_cbuf; docs/platform.md, "Kirin 9050's L0").
    l0a_bytes=Figure(0, "RT ini; PTO buffer_limits.hpp PTO_L0A_SIZE_BYTES 0u"),
    l0b_bytes=Figure(131072, "RT ini"),
    l0c_bytes=Figure(0, "RT ini; PTO buffer_limits.hpp PTO_L0C_SIZE_BYTES 0u"),
    vector_bytes_per_cycle=Figure(64, "EST: inferred from vec_calc_size=32",
                                  estimate=True),
    cube_mkn_fp16=Figure((16, 16, 8), "RT ini (default MKN 16,8,16)"),
    gm_bytes_per_cycle_per_core=Figure(15, "EST: about 15", estimate=True),
    max_block_dim=Figure(4, "RT kirin-dev/KirinDev0000.ini: 4 AI cores"),
    packaging=Figure("mobile OM expected; not yet in GE IsMobile() list", "GE ge_generator.cc"))
