"""Ascend data-centre NPUs: split AIC/AIV cores on HBM."""
from pypto_offline.targets.descriptor import Figure, Target
from pypto_offline.targets.pypto_support import PYPTO_0_2_0

ASCEND910B = Target(
    name="ascend910b", soc_version=Figure("Ascend910B1", "WHEEL A2A3.ini"),
    npu_arch=Figure(2201, "WHEEL A2A3.ini"), ai_cores=Figure(24, "WHEEL A2A3.ini ai_core_cnt"),
    ub_bytes=Figure(196608, "WHEEL A2A3.ini ub_size"),
    ub_plan_bytes=Figure(188416, "targets.md §6: plan with 184 KiB", estimate=True),
    gm_bandwidth_gbps=Figure(1420.0, "inferred: 32 B/cycle x 1.85 GHz x 24 cores (targets.md §2.1)",
                             estimate=True),
    launch_overhead_us=Figure(3.0, "targets.md §6: 2-5 us with task sink", estimate=True),
    dtypes=Figure(("float16", "bfloat16", "float32", "int8", "uint8", "int16", "int32", "bool"),
                  "WHEEL A2A3.ini intrinsic map; PTO arch_capability.hpp"),
    kernels=PYPTO_0_2_0)

ASCEND950 = Target(
    name="ascend950", soc_version=Figure("Ascend950PR_9589", "PY 950PR_958x.ini"),
    npu_arch=Figure(3510, "PY 950PR_958x.ini"), ai_cores=Figure(32, "RT cann-dev/Ascend950PR_9589.ini"),
    ub_bytes=Figure(253952, "PY 950PR_958x.ini ub_size"),
    ub_plan_bytes=Figure(245760, "UB less 8 KiB, as on 910B", estimate=True),
    gm_bandwidth_gbps=Figure(1600.0, "RM: HiBL 1.0 1.6 TB/s (950PR)"),
    launch_overhead_us=Figure(2.0, "targets.md §6: lower than 910B (vendor claims -50%)",
                              estimate=True),
    dtypes=Figure(("float16", "bfloat16", "float32", "int8", "uint8", "int16", "int32", "bool"),
                  "PTO arch_capability.hpp (A5)"),
    kernels=PYPTO_0_2_0)
