"""``pypto-offline verify`` checks what it says it checks (docs/outputs.md, "What verify
re-checks"): each compiled kernel's source derived again from the blob's graph and tile and
compared byte for byte, the onnxruntime run, and apart from both the build's record, which is
not run again. A blob is hostile input: here it is edited and re-signed with the blob writer,
as anyone can, so that the reader's own checks pass.

The example is built once with PyPTO; verifying it needs no PyPTO, which these tests show by
running ``verify`` with PyPTO hidden. The tests without the marker use a blob without kernels,
built without PyPTO."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import pypto_offline
from pypto_offline import cli
from pypto_offline.offline_compiler import blob, ptom_pb2
from tests.cache_entries import warm_cache
from tests.malformed import EXAMPLE
from tests.onnx_builders import one_node

REPO = Path(__file__).resolve().parent.parent
HIDDEN_PYPTO = REPO / "tests" / "data" / "no_pypto"  # a stand-in that refuses to import


@pytest.fixture(scope="module")
def example_build(tmp_path_factory, example_cache) -> tuple[Path, dict]:
    """The example built for kirin9050 (verified), and its JSON summary."""
    folder = tmp_path_factory.mktemp("example")
    cache = warm_cache(example_cache, folder)
    out = folder / "example.ptom"
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(EXAMPLE), "--target",
                           "kirin9050", "--input-shape", "x=1,3,64,64", "-o", str(out),
                           "--no-report", "--cache-dir", str(cache), "--json"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return out, json.loads(done.stdout)


@pytest.fixture(scope="module")
def kernel_free_blob(tmp_path_factory) -> Path:
    """A blob of one Relu: no region to fuse, so built without PyPTO."""
    folder = tmp_path_factory.mktemp("relu")
    model = folder / "relu.onnx"
    onnx.save(one_node("Relu", [2, 3], opset=17), model)
    out = folder / "relu.ptom"
    assert cli.main([str(model), "--target", "kirin9050", "-o", str(out), "--no-report",
                     "--quiet"]) == 0
    return out


def resigned(message: ptom_pb2.CompiledModel, path: Path) -> Path:
    """The edited message as the build writes one: each kernel's sha256 over itself again, then
    the blob writer's digest over the payload."""
    for kernel in message.kernels:
        kernel.sha256 = ""
        kernel.sha256 = hashlib.sha256(kernel.SerializeToString(deterministic=True)).hexdigest()
    return blob.write(path, message)


def verify_without_pypto(path: Path, *options: str) -> subprocess.CompletedProcess:
    """``pypto-offline verify`` in a process where importing PyPTO fails."""
    return subprocess.run([sys.executable, "-m", "pypto_offline", "verify", str(path), *options],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{HIDDEN_PYPTO}{os.pathsep}{REPO}"})


def verified_json(path: Path) -> tuple[int, dict]:
    """Its exit code and JSON output, which follows the schema whatever the verdict."""
    import jsonschema
    from importlib.resources import files

    done = verify_without_pypto(path, "--json")
    assert "Traceback" not in done.stderr, done.stderr
    output = json.loads(done.stdout)
    schema = json.loads(files("pypto_offline.offline_compiler").joinpath(
        "summary.schema.json").read_text())
    jsonschema.validate(output, {**schema, "$ref": "#/$defs/verify"},
                        cls=jsonschema.Draft202012Validator)
    return done.returncode, output


# --- a real blob, and copies of it edited ------------------------------------------------------

@pytest.mark.pypto
def test_an_untouched_blob_verifies_and_says_what_was_checked_now(example_build):
    path, _ = example_build
    code, summary = verified_json(path)
    assert code == 0
    assert summary["verification"] == {
        "status": "passed", "onnxruntime": "passed", "max_abs_diff": 0.0,
        # a graph compiled in its own types: no thresholds, the per-dtype tolerance
        "reference": None, "thresholds": None, "worst_output": None, "worst_kernel": None,
        "kernels_beyond_thresholds": [], "saturated_weights": [], "float_original": None,
        "metrics": {"y": {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0, "rms": 0.0,
                          "rel_distance": 0.0, "passed": True}},
        "kernel_sources": {"compiled": 1, "matching": 1, "differing": [], "fell_back": []},
        "gear": 0, "failed_gears": []}  # a blob of one shape: its one gear's check
    assert summary["build_record"] == {"kernels_checked": 1, "kernels_passed": 1}


@pytest.mark.pypto
def test_a_kernel_source_edited_and_resigned_is_refused_naming_the_kernel(example_build,
                                                                          tmp_path, capfd):
    """Issue 34, row 2: the compiled ONNX graph still passes in onnxruntime (the kernel's
    source is not in it), and the build's record still says 1/1; the source derived again
    does not match."""
    message = blob.read(example_build[0])
    (kernel,) = message.kernels
    assert "pypto.add(" in kernel.source
    kernel.source = kernel.source.replace("pypto.add(", "pypto.sub(")
    path = resigned(message, tmp_path / "edited.ptom")
    code, summary = verified_json(path)
    assert code == 1
    check = summary["verification"]
    assert (check["status"], check["onnxruntime"]) == ("failed", "passed")
    assert check["kernel_sources"]["matching"] == 0
    (differing,) = check["kernel_sources"]["differing"]
    assert differing["id"] == "region_0"
    assert "its source is not the one the generator writes" in differing["reason"]
    assert summary["build_record"] == {"kernels_checked": 1, "kernels_passed": 1}
    assert cli.main(["verify", str(path)]) == 1
    out = capfd.readouterr().out
    assert "kernel sources derived again: 0/1 match" in out and "region_0: its source" in out
    assert pypto_offline.load(path).verify().status == "failed"  # the API says the same


@pytest.mark.pypto
def test_a_kernel_marked_fallen_back_while_the_graph_still_calls_it_is_refused(example_build,
                                                                               tmp_path):
    """Marking the kernel as fallen back would take it out of the source check: the compiled
    graph must then not call it."""
    message = blob.read(example_build[0])
    message.kernels[0].compiled = False
    message.kernels[0].source = "anything"
    code, summary = verified_json(resigned(message, tmp_path / "hidden.ptom"))
    assert code == 1
    sources = summary["verification"]["kernel_sources"]
    assert sources["fell_back"] == ["region_0"]
    assert sources["differing"] == [{"id": "region_0", "reason": "the compiled graph calls it, "
                                     "but the blob records it as fallen back"}]


@pytest.mark.pypto
@pytest.mark.parametrize("edit, reason", [
    (lambda k: k.nodes.__setitem__(0, "no_such_node"), "names nodes the blob's graph does not"),
    (lambda k: k.ClearField("tuned_tile"), "records no tuned tile"),
    (lambda k: k.tuned_tile.__setattr__("budget_bytes", 0), "for its region and tile 0"),
    (lambda k: k.simplified[0].__setattr__("params_json", "{}"), ": simplified ops differ"),
    (lambda k: k.__setattr__("region_signature", "0" * 64), ": signature differ"),
])
def test_a_kernel_record_edited_otherwise_is_refused_not_crashed(edit, reason, example_build,
                                                                 tmp_path):
    message = blob.read(example_build[0])
    edit(message.kernels[0])
    code, summary = verified_json(resigned(message, tmp_path / "edited.ptom"))
    assert code == 1
    (differing,) = summary["verification"]["kernel_sources"]["differing"]
    assert reason in differing["reason"], differing


@pytest.mark.pypto
def test_a_build_reports_its_own_record_and_does_not_derive_its_sources_again(example_build):
    _, summary = example_build
    assert summary["verification"]["kernel_sources"] is None  # generated by this very build
    assert summary["verification"]["status"] == summary["verification"]["onnxruntime"] == "passed"
    assert summary["build_record"] == {"kernels_checked": 1, "kernels_passed": 1}


# --- without PyPTO: a blob without kernels -----------------------------------------------------

def test_a_blob_without_kernels_has_no_source_to_derive(kernel_free_blob):
    code, summary = verified_json(kernel_free_blob)
    assert code == 0
    assert summary["verification"]["kernel_sources"] == {"compiled": 0, "matching": 0,
                                                         "differing": [], "fell_back": []}
    assert summary["build_record"] == {"kernels_checked": 0, "kernels_passed": 0}


def test_a_compiled_kernel_the_graph_never_calls_is_refused(kernel_free_blob, tmp_path, capfd):
    message = blob.read(kernel_free_blob)
    message.kernels.append(ptom_pb2.Kernel(id="region_7", compiled=True, source="x = 1\n"))
    path = resigned(message, tmp_path / "claimed.ptom")
    assert cli.main(["verify", str(path)]) == 1
    out = capfd.readouterr().out
    assert ("region_7: the blob says it compiled, but the compiled graph never calls it" in out
            and "kernel sources derived again: 0/1 match" in out)


def test_a_fallen_back_kernel_is_named_as_having_no_source_to_check(kernel_free_blob, tmp_path,
                                                                   capfd):
    message = blob.read(kernel_free_blob)
    message.kernels.append(ptom_pb2.Kernel(id="region_0", compiled=False,
                                           fallback_reason="compile failed: no"))
    path = resigned(message, tmp_path / "fell.ptom")
    assert cli.main(["verify", str(path)]) == 0
    assert "1 fell back (their ops run unfused: no source to check)" in capfd.readouterr().out
