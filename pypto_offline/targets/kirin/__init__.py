"""Kirin phone NPUs (HarmonyOS CANN Kit): one coupled AI Core sharing LPDDR with the CPU.

Neither the NPU clock, the DRAM bandwidth the NPU sees, nor a launch cost is public
(``shared/targets.md`` §7): those figures are estimates, marked as such.
"""
from pypto_offline.targets.descriptor import Figure, Target
from pypto_offline.targets.pypto_support import PYPTO_0_2_0

_KIRIN_DTYPES = Figure(("float16", "float32", "int8", "uint8", "int16", "int32", "bool"),
                       "targets.md §2.4 HW-dt: no bf16, no fp8; Cast without s64")
_UB = Figure(131072, "RT kirin/*.ini ub_size")
_UB_PLAN = Figure(122880, "targets.md §6: plan with 120 KiB", estimate=True)
_LAUNCH = Figure(20.0, "targets.md §6: 10-30 us per task, mid-range", estimate=True)



def _kirin(name: str, soc_version: Figure, npu_arch: Figure, ai_cores: Figure,
           bandwidth: Figure, notes: str = "") -> Target:
    return Target(name=name, soc_version=soc_version, npu_arch=npu_arch, ai_cores=ai_cores,
                  ub_bytes=_UB, ub_plan_bytes=_UB_PLAN, gm_bandwidth_gbps=bandwidth,
                  launch_overhead_us=_LAUNCH, dtypes=_KIRIN_DTYPES, kernels=PYPTO_0_2_0,
                  notes=notes)


KIRIN90 = _kirin(
    "kirin90", Figure("KirinX90", "RT kirin/KirinX90.ini"), Figure(3003, "RT kirin/KirinX90.ini"),
    Figure(1, "RT kirin/KirinX90.ini"),
    Figure(80.0, "targets.md §6: 60-100 GB/s shared (GZ rumour)", estimate=True))

KIRIN9030 = _kirin(
    "kirin9030", Figure("Kirin9030", "RT kirin/Kirin9030.ini"),
    Figure(3113, "RT kirin/Kirin9030.ini"), Figure(1, "RT kirin/Kirin9030.ini"),
    Figure(50.0, "targets.md §6: 40-60 GB/s", estimate=True))

KIRIN9050 = _kirin(
    "kirin9050",
    Figure("KirinDev0000", "inferred: asc-devkit issue lists Kirin 9050 with KirinDev0001-0003 "
           "(targets.md §1)", estimate=True),
    Figure(5101, "RT kirin-dev/KirinDev0000.ini"), Figure(4, "RT kirin-dev/KirinDev0000.ini"),
    Figure(50.0, "unknown (targets.md §6); taken as Kirin 9030's", estimate=True),
    notes="Kirin 9050 is taken to be KirinDev0000 (arch 5101): an inference, not a fact.")
