"""PyPTO's environment in a worker, set up before and after ``import pypto``
(docs/pypto-recipes.md): the target platform's overlay first on the path, the pass-verify
calculator built once into a shared cache and loaded, the functional check's input hand-over
fix, and the AICore sources kept through a stand-in bisheng. Imported by the fork server
(``worker.py``), so it imports what the worker may (docs/determinism.md, "What the fork server
imports"): the job protocol, the rest inside its functions."""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import sys
from pathlib import Path

from pypto_offline.pypto_kernels.jobs.protocol import calculator_library


def pypto_lib() -> Path:
    spec = importlib.util.find_spec("pypto")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def prepare_environment(folder: Path, platform: dict) -> None:
    """Before ``import pypto``: quiet config, the platform's cost tables and simulated machine
    (platform.py), output and log folders inside ``folder``."""
    config = json.loads((pypto_lib() / "configs" / "tile_fwk_config.json").read_text())
    machine = [a.split("=")[0] + "=" for a in platform["simulator"]]
    args = [a for a in config["global"]["simulation"]["args"]
            if not a.startswith(("Model.drawPngThresholdCycle", "Model.deviceArch=", *machine))]
    args.append("Model.drawPngThresholdCycle=0")  # no matplotlib scripts, no tracebacks
    if platform["cost_model_arch"]:
        args.append(f"Model.deviceArch={platform['cost_model_arch']}")
    args += platform["simulator"]
    config["global"]["simulation"]["args"] = args
    if platform["device_platform"]:
        config["global"]["platform"]["device_platform"] = platform["device_platform"]
    # Codegen and passes in parallel threads number symbols and aliases in a racy order: one
    # thread keeps program.json and the AICore sources byte-identical from build to build.
    for section in (config, config["global"]):
        section.setdefault("codegen", {})["parallel_compile"] = 1
        section.setdefault("pass", {})["pass_thread_num"] = 1
    (folder / "tile_fwk_config.json").write_text(json.dumps(config, indent=1))
    os.environ["TILEFWK_CONFIG_PATH"] = str(folder / "tile_fwk_config.json")
    os.environ["PYPTO_HOME"] = str(folder / "pypto_home")
    os.environ["ASCEND_PROCESS_LOG_PATH"] = str(folder / "ascend_log")


def overlay_first(folder: Path, file_text: str) -> Path:
    """The platform's overlay of the installed package, made in the server's folder (whose real
    path has a fixed length: PyPTO handles the paths of its library folder, docs/determinism.md)
    and put first on the path, before anything imports pypto (platform.py)."""
    from pypto_offline.pypto_kernels.platform import OVERLAY_FOLDER, make_overlay

    overlay = make_overlay(file_text, pypto_lib().parent, folder / OVERLAY_FOLDER)
    sys.path.insert(0, str(overlay))
    importlib.invalidate_caches()
    return overlay


def load_calculator(cache: Path) -> None:
    """Build PyPTO's torch-based interpreter once per machine (about 30 s), then load it."""
    from pypto._utils import BuildOnlineManager

    manager = BuildOnlineManager()
    if manager.calculator_loaded:
        return
    import torch

    library = calculator_library(cache, torch.__version__)
    root = library.parents[2]
    if not library.exists():
        real_environ = os.environ  # _TorchContext replaces os.environ with a plain dict
        try:
            torch_ctx, cmake_ctx = manager._TorchContext(), manager._CMakeContext()
        finally:
            os.environ = real_environ
        staging = cache / f"build-{os.getpid()}"
        ctx = manager._CMakeContext.CompileContext(src_dir=Path(manager.pkg_lib_dir, "calculator"),
                                                   tmp_dir=staging)
        ctx.cfg_cmd_ext = (f"-DPY3_MOD_TORCH_VERSION={torch_ctx.torch_version}"
                           f" -DPY3_MOD_TORCH_ROOT_PATH={torch_ctx.torch_root_dir}"
                           f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI="
                           f"{torch_ctx.torch_c_use_cxx11_abi}")
        cmake_ctx.compile(ctx)
        with contextlib.suppress(OSError):  # another process may have won the race
            os.rename(staging, root)
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    manager.calculator_loaded = True


def enable_functional_check(cache: Path) -> None:
    """Hand the caller's tensors to pass-verify: stock 0.2.0 copies them through a no-op on CPU
    and interprets zeros (and later overwrites the inputs with those zeros)."""
    import pypto
    from pypto import pypto_impl
    from pypto._utils import BuildOnlineManager
    from pypto.frontend.parser import entry

    def setup_verify_data(pto_tensors):
        if not pypto.get_verify_options().get("enable_pass_verify"):
            return
        load_calculator(cache)
        pypto_impl.SetVerifyData(entry._pto_to_tensor_data(pto_tensors), [],
                                 entry._pto_verify_datas.get_data())

    BuildOnlineManager.build_and_load_calculator = lambda self: load_calculator(cache)
    entry.JitCallableWrapper._setup_verify_data = staticmethod(setup_verify_data)


STAND_IN_BISHENG = """#!/bin/sh
# Stand-in for the CCE compiler: PyPTO writes the AICore sources only when it can call bisheng.
# This creates the requested object file empty. No device binary is produced or claimed.
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
[ -n "$out" ] && : > "$out"
exit 0
"""


def keep_aicore_sources(folder: Path) -> Path:
    """After ``import pypto``: make codegen write ``kernel_aicore/*.cpp`` (pypto-cpu.md §5, way B).
    ASCEND_HOME_PATH only needs an ``include/pto`` folder; bisheng is the stand-in above, in the
    folder returned (for PATH)."""
    home = folder / "no_cann"
    (home / "include" / "pto").mkdir(parents=True, exist_ok=True)
    tools = folder / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "bisheng").write_text(STAND_IN_BISHENG)
    (tools / "bisheng").chmod(0o755)
    os.environ["ASCEND_HOME_PATH"] = str(home)  # os.environ's assignment also calls putenv
    return tools
