"""The .ptom blob and the command line around it: deterministic builds, a reader that refuses any
damaged byte, and compile / inspect / verify that agree."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pypto_offline
from pypto_offline import cli
from pypto_offline.errors import ModelError
from pypto_offline.offline_compiler import blob
from pypto_offline.pypto_kernels.platform import platform_of
from pypto_offline.targets import TARGETS
from tests.json_schema import schema_validator
from tests.cache_entries import warm_cache
from tests.malformed import EXAMPLE

SHAPE = ["--input-shape", "x=1,3,64,64"]
REPO = Path(__file__).resolve().parent.parent


def run_cli(*args, seed="0", cwd=None):
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run([sys.executable, "-m", "pypto_offline", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The example compiled twice, in two processes with different hash seeds and caches."""
    folder = tmp_path_factory.mktemp("builds")
    results = []
    for index, seed in enumerate(("0", "12345")):
        out = folder / f"example{index}.ptom"
        done = run_cli(EXAMPLE, "--target", "kirin9050", *SHAPE, "-o", out,
                       "--cache-dir", folder / f"cache{index}", "--json", seed=seed)
        assert done.returncode == 0, done.stderr
        results.append((out, json.loads(done.stdout)))
    return results


def test_generated_module_agrees_with_the_proto(tmp_path):
    from grpc_tools import protoc

    assert protoc.main(["protoc", f"-I{REPO}", f"--python_out={tmp_path}",
                        str(REPO / "pypto_offline/offline_compiler/ptom.proto")]) == 0
    regenerated = tmp_path / "pypto_offline/offline_compiler/ptom_pb2.py"
    committed = REPO / "pypto_offline/offline_compiler/ptom_pb2.py"
    assert regenerated.read_bytes() == committed.read_bytes()


@pytest.mark.pypto
def test_two_builds_are_byte_identical(builds):
    (first, _), (second, _) = builds
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.pypto
def test_two_builds_write_byte_identical_reports_beside_their_blobs(builds):
    (first, one), (second, two) = builds
    reports = [Path(one["report"]), Path(two["report"])]
    assert reports == [first.with_name("example0.report.html"),
                       second.with_name("example1.report.html")]
    assert reports[0].read_bytes() == reports[1].read_bytes()


@pytest.mark.pypto
def test_summary_has_the_promised_fields(builds):
    _, summary = builds[0]
    for key in ("model", "model_sha256", "target", "blob", "report", "nodes_before", "nodes_after",
                "kernels_before", "kernels_after", "fused_kernels", "ops_fused",
                "gm_bytes_before", "gm_bytes_after", "gm_bytes_lower_bound",
                "est_time_us_before", "est_time_us_after", "pypto", "verification",
                "compile_seconds"):
        assert key in summary, key
    assert summary["pypto"]["compiled"] == summary["fused_kernels"] == 1
    assert summary["pypto"]["cost_us_fused"] < summary["pypto"]["cost_us_unfused"]
    assert summary["pypto"]["cost_us_unfused_basis"] == "estimated"  # docs/baseline.md
    assert summary["verification"] == {
        "status": "passed", "onnxruntime": "passed", "max_abs_diff": 0.0,
        "reference": None, "thresholds": None, "worst_output": None, "worst_kernel": None,
        "kernels_beyond_thresholds": [], "kernel_sources": None, "saturated_weights": [],
        "float_original": None,
        "metrics": {"y": {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0, "rms": 0.0,
                          "rel_distance": 0.0, "passed": True}},
        "gear": 0, "failed_gears": []}  # a blob of one shape: its one gear's check
    assert summary["precision_mode"] == "must_keep_origin_dtype" and summary["precision"] is None
    assert summary["build_record"] == {"kernels_checked": 1, "kernels_passed": 1}
    assert (summary["kernels_before"], summary["kernels_after"]) == (6, 2)


@pytest.mark.pypto
def test_cli_inspect_and_verify_agree(builds):
    path, compiled = builds[0]
    inspected = json.loads(run_cli("inspect", path, "--json").stdout)
    verified = run_cli("verify", path, "--onnx", EXAMPLE, "--json")
    assert verified.returncode == 0, verified.stderr
    verified = json.loads(verified.stdout)
    shared = set(compiled) - {"blob", "report", "kernel_cache", "compile_seconds", "timings",
                              "model", "verification", "gears"}
    for key in shared:
        assert inspected[key] == compiled[key] == verified[key], key
    # each gear's verification holds what was checked now, as the top level's does
    assert [{**g, "verification": None} for g in inspected["gears"]] == \
        [{**g, "verification": None} for g in verified["gears"]]
    assert [g["verification"] for g in inspected["gears"]] == [
        {**g["verification"], "kernel_sources": None} for g in verified["gears"]]
    # verify derived the kernel sources again; the build and inspect show no such check
    assert verified["verification"]["kernel_sources"]["matching"] == 1
    assert inspected["verification"] == compiled["verification"] == {
        **verified["verification"], "kernel_sources": None}
    assert [k["id"] for k in inspected["kernels"]] == ["region_0"]
    assert inspected["provenance"]["pypto"] == "0.2.0"
    assert "/" not in json.dumps(inspected["provenance"]["options"])  # no paths


@pytest.mark.pypto
def test_every_json_output_follows_the_schema(builds, tmp_path):
    """compile, inspect, verify, report, targets and cache: schema_version 2, the keys the
    schema file promises, and nothing outside them where it says so."""
    path, compiled = builds[0]
    outputs = {"build": compiled,
               "inspect": json.loads(run_cli("inspect", path, "--json").stdout),
               "verify": json.loads(run_cli("verify", path, "--json").stdout),
               "report": json.loads(run_cli("report", path, "-o", tmp_path / "r.html",
                                            "--json").stdout),
               "targets": json.loads(run_cli("targets", "--json").stdout),
               "cache_info": json.loads(run_cli("cache", "info", "--json", "--cache-dir",
                                                path.parent / "cache0").stdout),
               "cache_clean": json.loads(run_cli("cache", "clean", "--older-than", "3650",
                                                 "--json", "--cache-dir",
                                                 path.parent / "cache0").stdout)}
    for kind, output in outputs.items():
        errors = [e.message for e in schema_validator(kind).iter_errors(output)]
        assert not errors, (kind, errors[:3])
        assert output["schema_version"] == 8
    (kernel,) = compiled["kernels"]
    assert kernel["status"] == "compiled" and kernel["fallback_category"] is None
    broken = {**compiled, "kernels": [{**kernel, "status": "maybe"}]}
    assert not schema_validator("build").is_valid(broken)  # the schema does check


def _refused(data: bytes) -> bool:
    try:
        blob.from_bytes(data)
    except ModelError:
        return True
    return False


@pytest.mark.pypto
def test_any_flipped_byte_or_truncation_is_refused(builds):
    data = builds[0][0].read_bytes()
    positions = list(range(blob.HEADER.size)) + list(range(blob.HEADER.size, len(data), 97))
    positions.append(len(data) - 1)
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        assert _refused(bytes(damaged)), position
    for length in (0, 3, blob.HEADER.size - 1, blob.HEADER.size, len(data) // 2, len(data) - 1):
        assert _refused(data[:length]), length


@pytest.mark.pypto
@pytest.mark.parametrize("damage", ["flip", "truncate", "random", "version"])
def test_the_cli_refuses_a_damaged_blob_with_exit_2(damage, builds, tmp_path, capfd):
    data = bytearray(builds[0][0].read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 1
    elif damage == "truncate":
        data = data[:-10]
    elif damage == "random":
        data = bytearray(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8))
    else:
        data[4] = 9
    path = tmp_path / "damaged.ptom"
    path.write_bytes(bytes(data))
    for command in ("inspect", "verify"):
        assert cli.main([command, str(path)]) == 2
        err = capfd.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "damaged.ptom" in err
        assert "Traceback" not in err


@pytest.mark.pypto
def test_a_wrong_compiled_graph_fails_verification_with_exit_1(builds, tmp_path):
    message = blob.read(builds[0][0])
    import onnx

    wrong = onnx.load_from_string(message.onnx_model)
    wrong.graph.node[-1].op_type = "Sub" if wrong.graph.node[-1].op_type == "Add" else "Add"
    wrong.graph.node[-1].domain = ""
    message.onnx_model = wrong.SerializeToString()
    path = blob.write(tmp_path / "wrong.ptom", message)
    done = run_cli("verify", path, "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["verification"]["status"] == "failed"


@pytest.mark.pypto
def test_reader_checks_the_target(builds):
    with pytest.raises(ModelError, match="compiled for 'kirin9050', not 'ascend910b'"):
        pypto_offline.load(builds[0][0], expected_target="ascend910b")


@pytest.mark.pypto
def test_real_inputs_from_npz_and_their_errors(builds, tmp_path, capfd):
    path = builds[0][0]
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((1, 3, 64, 64), np.float32))
    assert cli.main(["verify", str(path), "--inputs", str(inputs)]) == 0
    np.savez(tmp_path / "bad.npz", y=np.ones(3, np.float32))
    assert cli.main(["verify", str(path), "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "'y', which is not a model input" in capfd.readouterr().err


def test_targets_lists_every_chip_with_sources(capfd):
    assert cli.main(["targets", "--json"]) == 0
    printed = json.loads(capfd.readouterr().out)
    assert printed["schema_version"] == 8
    listing = printed["targets"]
    assert set(listing) == set(TARGETS)
    for name, figures in listing.items():
        for key, figure in figures.items():
            if key not in ("notes", "chip_names"):
                assert figure["source"], (name, key)
    assert listing["kirin9050"]["soc_version"]["estimate"] is True  # 9050 = KirinDev0000: inferred
    for name, figures in listing.items():  # the fields a descriptor holds (docs/target-sources.md)
        for field in ("soc_version", "npu_arch", "cce_arch", "ai_cores", "aiv_cores", "coupled",
                      "clock_mhz", "ub_bytes", "ub_plan_bytes", "l1_bytes", "l0a_bytes",
                      "l0b_bytes", "l0c_bytes", "l2_bytes", "ub_block_bytes",
                      "vector_bytes_per_cycle", "cube_mkn_fp16", "dtypes", "gm_bandwidth_gbps",
                      "gm_bytes_per_cycle_per_core", "launch_overhead_us", "max_block_dim",
                      "gm_atomics", "hw_cross_core_sync", "packaging"):
            assert field in figures, (name, field)
    assert listing["kirin90"]["clock_mhz"]["estimate"] and not listing["ascend910b"]["clock_mhz"]["estimate"]
    assert listing["ascend910b"]["ub_bytes"]["value"] == 196608


def test_a_failed_build_writes_nothing(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(EXAMPLE.read_bytes()[:100])
    assert cli.main([str(broken), "--target", "kirin9050"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx"]


@pytest.mark.parametrize("option", [["-o", "missing/x.ptom"], ["--report", "missing/x.html"]])
def test_an_output_into_a_missing_folder_is_refused_before_any_work(option, tmp_path, capfd):
    model = tmp_path / "example.onnx"
    model.write_bytes(EXAMPLE.read_bytes())
    option = [option[0], str(tmp_path / option[1])]
    assert cli.main([str(model), "--target", "kirin9050", *SHAPE, *option]) == 2
    assert "does not exist" in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.onnx"]


@pytest.mark.pypto
@pytest.mark.parametrize("target", ["kirin9030", "ascend950"])
def test_cold_builds_under_a_platform_overlay_are_byte_identical(target, tmp_path):
    """The platform's overlay sits in each fork server's own folder (docs/platform.md): two
    cold builds at once, in caches whose paths differ in length, as two hosts' would, give
    the same blob (kirin9050's, the builds above and the Ray farm's tests cover another
    overlay; ascend910b's platform is PyPTO's own)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    runs = [subprocess.Popen([sys.executable, "-m", "pypto_offline", str(EXAMPLE), "--target",
                              target, *SHAPE, "-o", str(tmp_path / f"b{i}.ptom"), "--no-report",
                              "--no-verify", "--cache-dir", str(tmp_path / cache), "--quiet"],
                             env=env, stderr=subprocess.PIPE, text=True)
            for i, cache in enumerate(("c", "a-much-longer-cache-folder-name/of/another/host"))]
    assert [run.wait() for run in runs] == [0, 0], [run.stderr.read() for run in runs]
    first, second = (tmp_path / "b0.ptom").read_bytes(), (tmp_path / "b1.ptom").read_bytes()
    assert first == second
    assert pypto_offline.load(tmp_path / "b0.ptom").summary()["platform"]["digest"] == \
        platform_of(TARGETS[target]).digest


@pytest.fixture(scope="module")
def targets_cache(tmp_path_factory, example_cache):
    """One kernel cache for the example on every target, as a build farm keeps one (holding
    kirin9050's kernel from the start): a target compiles under its own platform
    (docs/platform.md), plans, picks its tiles within its own UB and ships its own blob."""
    return warm_cache(example_cache, tmp_path_factory.mktemp("targets"))


@pytest.mark.pypto
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_example_compiles_for_every_target(target, tmp_path, targets_cache):
    out = tmp_path / f"example.{target}.ptom"
    report = ["--no-report"] if target == "kirin90" else ["--report", str(tmp_path / "r.html")]
    assert cli.main([str(EXAMPLE), "--target", target, *SHAPE, "-o", str(out), *report,
                     "--cache-dir", str(targets_cache), "--quiet"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir() if p.name != "cache")
    assert written == ([out.name] if target == "kirin90" else [out.name, "r.html"])
    compiled = pypto_offline.load(out, expected_target=target)
    assert compiled.summary()["verification"]["status"] == "passed"
    assert compiled.summary()["pypto"]["compiled"] == 1
    # compiled under the target's own platform (docs/platform.md), as the blob records it
    assert compiled.summary()["platform"]["digest"] == platform_of(TARGETS[target]).digest
