"""Each target's platform inside PyPTO (pypto_kernels/platform.py, docs/platform.md): generated
from its descriptor, native where PyPTO knows the chip, refused when a figure is missing."""
from __future__ import annotations

import dataclasses
import html
import json
import shutil

import pytest

from pypto_offline.offline_compiler.build import BuildOptions, build
from pypto_offline.pypto_kernels import platform, worker_setup
from pypto_offline.pypto_kernels.platform import (PlatformFigureMissing, PlatformUnavailable,
                                                  installed_configs, make_overlay, platform_for,
                                                  platform_of)
from pypto_offline.targets import TARGETS

# The simulator's own machine (tile_fwk_config.json's defaults, seen in _simulate.config.ini):
# 6 AI CPUs, each with 4 cube and 8 vector cores, the 910B's buffers.
SIMULATOR_DEFAULTS = ("Model.aicpuMachineNumber=6", "Model.coreMachineNumberPerAICPU=12",
                      "Model.cubeMachineNumberPerAICPU=4", "Model.vecMachineNumberPerAICPU=8",
                      "Pipe.ubSizeThreshold=196608", "Pipe.l1SizeThreshold=524288",
                      "Pipe.l0aSizeThreshold=65536", "Pipe.l0bSizeThreshold=65536",
                      "Pipe.l0cSizeThreshold=131072")


def test_ascend910b_is_pypto_s_own_platform_and_the_others_are_overlays():
    kinds = {name: platform_of(target).native for name, target in TARGETS.items()}
    assert kinds == {"kirin90": False, "kirin9030": False, "kirin9050": False,
                     "ascend910b": True, "ascend950": False}
    native = platform_of(TARGETS["ascend910b"])
    assert native.file_text == (installed_configs() / "A2A3.ini").read_text()
    assert native.simulator == () and native.device_platform is None


@pytest.mark.parametrize("name", ["kirin90", "kirin9030", "kirin9050", "ascend950"])
def test_an_overlay_file_is_pypto_s_with_the_chip_s_figures_written_in(name):
    target, chip = TARGETS[name], platform_of(TARGETS[name])
    stock = (installed_configs() / "A2A3.ini").read_text().splitlines()
    written = chip.file_text.splitlines()
    assert written[0].startswith(f"# pypto-offline: {name}")
    changed = {a.split("=")[0]: b for a, b in zip(stock, written[1:]) if a != b}
    figures = dict(chip.figures)
    assert set(changed) <= set(figures) and len(stock) == len(written) - 1
    for key, figure in figures.items():
        if key != "ai_cpu_cnt":
            assert f"{key}={figure.value}" in written
    assert figures["ub_size"].value == target.ub_plan_bytes.value
    assert figures["ai_core_cnt"].value == target.ai_cores.value
    assert figures["vector_core_cnt"].value == target.aiv_cores.value
    assert chip.description().startswith("code for the 910B's instruction set (DAV_2201), "
                                          f"compiled under {target.soc_version.value}'s memory")


def test_the_cost_model_machine_is_the_chip_s_cores_and_the_910b_s_is_the_simulator_default():
    machine = {name: platform_of(t).simulator[:4] for name, t in TARGETS.items()
               if not platform_of(t).native}
    assert machine["kirin9030"] == ("Model.aicpuMachineNumber=1",
                                    "Model.coreMachineNumberPerAICPU=2",
                                    "Model.cubeMachineNumberPerAICPU=1",
                                    "Model.vecMachineNumberPerAICPU=1")
    assert machine["kirin9050"][2:] == ("Model.cubeMachineNumberPerAICPU=4",
                                        "Model.vecMachineNumberPerAICPU=4")
    assert machine["ascend950"] == ("Model.aicpuMachineNumber=4",  # 32 AIC, 64 AIV, 6 AI CPUs
                                    "Model.coreMachineNumberPerAICPU=24",
                                    "Model.cubeMachineNumberPerAICPU=8",
                                    "Model.vecMachineNumberPerAICPU=16")
    # the same rule on the 910B's own figures gives the simulator's defaults, but for the UB:
    # an overlay's is the tiling's plan, the chip's less its margin (docs/platform.md)
    figures = platform.platform_figures(TARGETS["ascend910b"])
    plan = TARGETS["ascend910b"].ub_plan_bytes.value
    assert plan < 196608
    assert platform.machine(TARGETS["ascend910b"], figures) == tuple(
        f"Pipe.ubSizeThreshold={plan}" if a.startswith("Pipe.ubSizeThreshold") else a
        for a in SIMULATOR_DEFAULTS)


def test_kirin9050_without_l0a_and_l0c_gets_its_l0b_size_marked_as_an_estimate():
    figures = dict(platform_of(TARGETS["kirin9050"]).figures)
    assert TARGETS["kirin9050"].l0a_bytes.value == 0 and TARGETS["kirin9050"].l0c_bytes.value == 0
    for key in ("l0_a_size", "l0_c_size"):
        assert figures[key].value == 131072 and figures[key].estimate
        assert "has no L0" in figures[key].source
    assert not figures["l0_b_size"].estimate


def test_platforms_differ_by_digest_and_a_digest_is_stable():
    digests = {name: platform_of(t).digest for name, t in TARGETS.items()}
    assert len(set(digests.values())) == len(digests)
    again = platform_for(TARGETS["kirin9030"], installed_configs())
    assert again.digest == digests["kirin9030"] and again == platform_of(TARGETS["kirin9030"])


def test_a_missing_figure_stops_the_build_at_start_up_naming_the_target_and_figure(tmp_path):
    lacking = dataclasses.replace(TARGETS["kirin9030"], l1_bytes=None)
    with pytest.raises(PlatformFigureMissing, match="target kirin9030 has no l1_bytes figure "
                                                    r"\(l1_size of its platform file\)"):
        build(tmp_path / "no-such-model.onnx", lacking, BuildOptions())  # before the model


def _fake_install(tmp_path, files: dict[str, str]):
    """A configs folder of a PyPTO install: the installed one's files, and ``files``."""
    configs = tmp_path / "pypto" / "lib" / "configs"
    shutil.copytree(installed_configs(), configs)
    for name, text in files.items():
        (configs / name).write_text(text)
    return configs


def test_a_pypto_that_ships_the_chip_s_own_file_is_used_natively(tmp_path, monkeypatch):
    own = "[version]\nSoC_version=Kirin9030\nNpuArch=3113\n[SoCInfo]\nai_core_cnt=1\n" \
          "[AICoreSpec]\nub_size=131072\nl1_size=524288\n"
    configs = _fake_install(tmp_path, {"Kirin9030.ini": own})
    chip = platform_for(TARGETS["kirin9030"], configs)
    assert chip.native and chip.file_name == "Kirin9030.ini" and chip.file_text == own
    assert chip.simulator == () and chip.device_platform == "Kirin9030"
    assert dict(chip.figures)["ub_size"].source == "PyPTO Kirin9030.ini"
    assert chip.description().startswith("compiled under PyPTO's own Kirin9030 platform")
    assert chip.digest != platform_of(TARGETS["kirin9030"]).digest
    # the fork server then selects it by name and builds no overlay
    settings = chip.server_settings()
    assert settings["native"] and settings["device_platform"] == "Kirin9030"
    folder = tmp_path / "server"
    folder.mkdir()
    monkeypatch.setattr("os.environ", dict(worker_setup.os.environ))  # prepare_environment sets some
    worker_setup.prepare_environment(folder, settings)
    config = json.loads((folder / "tile_fwk_config.json").read_text())
    assert config["global"]["platform"]["device_platform"] == "Kirin9030"
    assert not any(a.startswith("Model.aicpuMachineNumber")
                   for a in config["global"]["simulation"]["args"])
    # an overlay's server gets the chip's machine instead
    worker_setup.prepare_environment(folder, platform_of(TARGETS["kirin9030"]).server_settings())
    config = json.loads((folder / "tile_fwk_config.json").read_text())
    assert "Model.vecMachineNumberPerAICPU=1" in config["global"]["simulation"]["args"]
    assert f"Pipe.ubSizeThreshold={TARGETS['kirin9030'].ub_plan_bytes.value}" in \
        config["global"]["simulation"]["args"]


def test_another_pypto_s_platform_file_is_not_written_over(tmp_path):
    stock = (installed_configs() / "A2A3.ini").read_text()
    configs = _fake_install(tmp_path, {"A2A3.ini": stock.replace("ub_size=196608",
                                                                   "ub_size=262144")})
    with pytest.raises(PlatformUnavailable, match="is not the platform file of pypto 0.2.0"):
        platform_for(TARGETS["kirin9030"], configs)
    assert platform_for(TARGETS["ascend910b"], configs).native  # its own chip: used as it is


def test_an_overlay_links_every_installed_entry_but_the_platform_file(tmp_path):
    installed = installed_configs().parent.parent
    chip = platform_of(TARGETS["kirin9030"])
    root = make_overlay(chip.file_text, installed, tmp_path / "overlay")
    package = root / "pypto"
    assert sorted(p.name for p in package.iterdir()) == sorted(p.name for p in installed.iterdir())
    configs = package / "lib" / "configs"
    assert (configs / "A2A3.ini").read_text() == chip.file_text
    assert not (configs / "A2A3.ini").is_symlink()
    assert (configs / "tile_fwk_config.json").resolve() == \
        (installed / "lib" / "configs" / "tile_fwk_config.json").resolve()
    assert (package / "__init__.py").resolve() == (installed / "__init__.py").resolve()
    assert (installed / "lib" / "configs" / "A2A3.ini").read_text() != chip.file_text


def _matmul_silu(m: int = 512, k: int = 256, n: int = 512):
    """x @ w + b, then SiLU: a matmul root whose larger product tiles need more L0 than Kirin
    9030 has (its L0B 32 KiB, L0C 64 KiB against the 910B's 64 and 128)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((k, n)) / 16).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["z"])]
    graph = helper.make_graph(
        nodes, "matmul_silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [m, n])], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def matmul_builds(tmp_path_factory):
    import pypto_offline

    folder = tmp_path_factory.mktemp("platforms")
    model = _matmul_silu()
    built = {}
    for target in ("ascend910b", "kirin9030"):  # the Kirin build also searched as on the 910B
        compiled = pypto_offline.compile(model, target, cache_dir=folder / "cache", verify=True,
                                         compare_platform=True)
        report = compiled.write_report(folder / f"{target}.html")
        built[target] = (compiled, report.read_text())
    return built


@pytest.mark.pypto
def test_a_tile_the_910b_ships_is_refused_by_pypto_under_kirin9030_and_a_smaller_one_ships(
        matmul_builds):
    def kernel(target):
        (only,) = matmul_builds[target][0].message.kernels
        return only
    on_910b, on_9030 = kernel("ascend910b"), kernel("kirin9030")
    assert on_910b.compiled and on_9030.compiled
    best = on_910b.tuned_tile.budget_bytes
    refused = {c.budget_bytes: c.error for c in on_9030.candidates if c.error}
    # PyPTO's own words, from its log: the buffer of Kirin 9030's platform the tile overflows
    assert best in refused, [(c.budget_bytes, c.error) for c in on_9030.candidates]
    assert "exceeds MEM_L0" in refused[best] and ("size [65536]" in refused[best]
                                                  or "size [32768]" in refused[best])
    assert all(c.error == "" for c in on_910b.candidates)  # the 910B compiled every one
    assert on_9030.tuned_tile.budget_bytes < best
    # one AI core: the same kind of kernel is timed far slower than on 24 + 48 cores
    assert on_9030.tuned_tile.aicore_us > 3 * on_910b.tuned_tile.aicore_us
    for target, (compiled, report) in matmul_builds.items():
        assert compiled.summary()["verification"]["status"] == "passed"
        assert "refused: " in report if target == "kirin9030" else "refused: " not in report


@pytest.mark.pypto
@pytest.mark.parametrize("target", ["ascend910b", "kirin9030"])
def test_the_blob_and_the_report_say_which_platform_the_kernels_compiled_under(matmul_builds,
                                                                               target):
    compiled, report = matmul_builds[target]
    recorded, expected = compiled.summary()["platform"], platform_of(TARGETS[target])
    assert recorded["digest"] == expected.digest and recorded["native"] == expected.native
    assert recorded["chip"] == TARGETS[target].soc_version.value and recorded["isa"] == "DAV_2201"
    # an overlay states the tiling's planned UB; PyPTO's own file (ascend910b) the chip's
    ub = TARGETS[target].ub_bytes if expected.native else TARGETS[target].ub_plan_bytes
    assert recorded["figures"]["ub_size"]["value"] == ub.value
    assert expected.description() in html.unescape(report)
    (kernel,) = compiled.message.kernels
    assert kernel.platform == expected.description()
    if target == "kirin9030":
        assert ("code for the 910B's instruction set (DAV_2201), compiled under Kirin9030's "
                "memory sizes and core count") in html.unescape(report)


@pytest.mark.pypto
def test_compare_platform_records_the_tile_the_910b_platform_would_have_shipped(matmul_builds):
    compiled, report = matmul_builds["kirin9030"]
    (kernel,) = compiled.summary()["kernels"]
    (own,) = compiled.message.kernels
    refused = {c.budget_bytes for c in own.candidates if c.error}
    # the same search under the 910B's figures ships the tile Kirin 9030's buffers refuse
    assert kernel["tile_910b"]["budget_bytes"] in refused
    assert kernel["tile_910b"]["aicore_us"] < kernel["tuned_us"]
    comparison = compiled.summary()["platform_comparison"]
    assert comparison == {"kernels_compared": 1, "tiles_changed": 1,
                          "pypto_us": kernel["tuned_us"],
                          "pypto_us_910b": kernel["tile_910b"]["aicore_us"]}
    assert compiled.message.provenance.options["compare_platform"] == "910b"
    text = html.unescape(report)
    assert "Against PyPTO's 910B platform" in text and "tiles changed on 1 of 1 kernels" in text
    assert ">910B platform<" in text  # the tile table's row
    # the 910B target's own platform is the 910B's: nothing to compare
    on_910b = matmul_builds["ascend910b"][0].summary()
    assert on_910b["platform_comparison"] is None and on_910b["kernels"][0]["tile_910b"] is None
