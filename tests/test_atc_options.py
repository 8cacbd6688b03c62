"""ATC users' spellings where they mean what ours do (issue 51): ``--model=FILE``, ``--framework
5``, ``--output NAME`` writing NAME.ptom, ``--input_format`` checked against the model; and the
first build on a machine saying that it builds PyPTO's host library (the calculator) before the
two minutes that takes. The models are one MatMul, which builds without a PyPTO kernel, or a
Relu whose job is answered here without PyPTO: the fast tier."""
from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from pypto_offline import api, cli
from pypto_offline.pypto_kernels.jobs.executor import HOST_LIBRARY_NOTICE, LocalExecutor
from pypto_offline.pypto_kernels.jobs.processes import calculator_cache
from pypto_offline.pypto_kernels.jobs.protocol import (Failure, FailureKind, JobResult,
                                                       calculator_library)
from tests.onnx_builders import GraphBuilder, one_node

TARGET = ["--target", "kirin9050", "--no-report"]


def matmul_model(folder: Path, shape=(2, 3), name: str = "mm") -> Path:
    """x[shape] @ w[3, 4]: a contraction, no memory-bound op to compile."""
    model = one_node("MatMul", list(shape), opset=17,
                     params={"w": np.arange(12, dtype=np.float32).reshape(3, 4)})
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    return path


def options_of(blob: Path) -> dict:
    return dict(api.load(str(blob)).message.provenance.options)


@pytest.mark.parametrize("value,named", [("0", "Caffe"), ("1", "MindSpore"),
                                         ("3", "TensorFlow"), ("onnx", None)])
def test_a_framework_other_than_onnx_is_exit_2_writing_nothing(tmp_path, capfd, value, named):
    model = matmul_model(tmp_path)
    assert cli.main([str(model), *TARGET, "--framework", value, "--output-dir",
                     str(tmp_path / "out")]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert "pypto-offline reads ONNX models only (--framework 5)" in line
    assert (f"({named})" in line) if named else "(" not in line.split(":")[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mm.onnx"]


def test_model_equals_file_with_framework_5_and_output_name_writes_name_ptom(tmp_path, capfd):
    """ATC's own command line: ``--model=FILE --framework=5 --output=NAME``, NAME.ptom beside
    NAME as ATC writes NAME.om; a name already ending in .ptom is kept."""
    model = matmul_model(tmp_path)
    assert cli.main([f"--model={model}", "--framework=5", f"--output={tmp_path / 'net'}",
                     "--soc_version=Kirin9050", "--no-report", "--quiet"]) == 0
    assert cli.main(["--model", str(model), *TARGET, "--quiet", "--output",
                     str(tmp_path / "kept.ptom")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.ptom", "mm.onnx", "net.ptom"]
    assert "framework" not in options_of(tmp_path / "net.ptom")  # ONNX is all there is
    assert capfd.readouterr().err == ""


def test_model_option_and_model_arguments_are_one_batch(tmp_path, capfd):
    first, second = matmul_model(tmp_path, name="a"), matmul_model(tmp_path, name="b")
    out = tmp_path / "out"
    assert cli.main([str(first), f"--model={second}", *TARGET, "--quiet",
                     "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.kirin9050.ptom", "b.kirin9050.ptom"]
    assert cli.main([*TARGET, "--output-dir", str(out)]) == 2  # no model at all
    assert "no model given" in capfd.readouterr().err


def test_input_format_is_checked_against_the_model_and_recorded(tmp_path, capfd):
    flat, image = matmul_model(tmp_path), matmul_model(tmp_path, (1, 2, 5, 3), "image")
    assert cli.main([str(flat), *TARGET, "--quiet", "--input_format", "NCHW", "-o",
                     str(tmp_path / "flat")]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert "--input_format NCHW describes 4-D inputs and the model has none (its inputs: " \
           "'x' 2-D)" in line and "--input_format ND" in line
    assert not (tmp_path / "flat.ptom").exists()
    assert cli.main([str(image), *TARGET, "--quiet", "--input_format", "nchw", "-o",
                     str(tmp_path / "nchw")]) == 0
    assert cli.main([str(flat), *TARGET, "--quiet", "--input-format=ND", "-o",
                     str(tmp_path / "nd")]) == 0
    assert cli.main([str(flat), *TARGET, "--quiet", "-o", str(tmp_path / "none")]) == 0
    assert options_of(tmp_path / "nchw.ptom")["input_format"] == "NCHW"
    assert options_of(tmp_path / "nd.ptom")["input_format"] == "ND"
    # a build that does not give it says nothing of it: its blob is the bytes it always was
    assert "input_format" not in options_of(tmp_path / "none.ptom")
    assert api.load(str(tmp_path / "nd.ptom")).message.onnx_model == \
        api.load(str(tmp_path / "none.ptom")).message.onnx_model


@pytest.mark.parametrize("value,said", [
    ("NHWC", "--input_format NHWC is ATC's for TensorFlow models; for an ONNX model ATC takes "
             "NCHW, NCDHW, ND"),
    ("NC1HWC0", "--input_format 'NC1HWC0' is none of ATC's formats for an ONNX model (NCHW, "
                "NCDHW, ND)")])
def test_an_input_format_atc_refuses_for_onnx_is_exit_2_before_any_work(tmp_path, capfd, value,
                                                                        said):
    model = matmul_model(tmp_path, (1, 2, 5, 3))
    assert cli.main([str(model), *TARGET, "--input_format", value, "--output-dir",
                     str(tmp_path / "out")]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert said in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mm.onnx"]


def test_the_cli_help_names_atc_s_spellings(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--model FILE" in text and "--framework 5" in text
    assert "--input_format NCHW|NCDHW|ND" in text


# --- the first build on a machine: PyPTO's host library ---------------------------------------

class NoPyPTO(LocalExecutor):
    """This machine's executor as the build sees it, its jobs answered without a fork server
    (no calculator is built): each region's compile fails, and it falls back."""

    def run(self, folder, job, target, timeout):
        self.jobs = getattr(self, "jobs", 0) + 1
        return JobResult.failed(Failure.of(FailureKind.COMPILE_FAILED, ": made up by the test"))


def relu_model(folder: Path) -> Path:
    b = GraphBuilder()
    path = folder / "relu.onnx"
    onnx.save(b.model(b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 32])])])), path)
    return path


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """A user cache with no calculator built in it (the calculator's folder is under it), this
    machine's jobs answered by ``NoPyPTO``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(LocalExecutor, "run", NoPyPTO.run)
    assert calculator_cache() == tmp_path / "xdg" / "pypto-offline" / "calculator"
    return tmp_path


def build(folder: Path, *options: str) -> list[str]:
    return [str(relu_model(folder)), *TARGET, "--no-verify", "--cache-dir",
            str(folder / "kernels"), "-o", str(folder / "relu"), *options]


def test_the_first_build_on_a_machine_says_it_builds_pypto_s_host_library(fresh_machine,
                                                                           capfd):
    assert cli.main(build(fresh_machine)) == 0
    err = capfd.readouterr().err.splitlines()
    said = [i for i, line in enumerate(err) if line.endswith(HOST_LIBRARY_NOTICE)]
    first_kernel = next(i for i, line in enumerate(err) if line.startswith("[1/"))
    assert len(said) == 1 and said[0] < first_kernel, err
    assert HOST_LIBRARY_NOTICE == "building PyPTO's host library once (~2 min)"


def test_the_host_library_line_keeps_quiet_and_json_clean(fresh_machine, capfd):
    assert cli.main(build(fresh_machine, "--quiet")) == 0
    assert capfd.readouterr().err == ""
    (fresh_machine / "relu.ptom").unlink()
    assert cli.main(build(fresh_machine, "--json", "--cache-dir", str(fresh_machine / "k2"))) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["blob"] == str(fresh_machine / "relu.ptom")
    assert HOST_LIBRARY_NOTICE in err and HOST_LIBRARY_NOTICE not in out


def test_no_host_library_line_once_it_is_built_or_when_no_job_runs(fresh_machine, capfd):
    library = calculator_library(calculator_cache(), importlib.metadata.version("torch"))
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert cli.main(build(fresh_machine)) == 0
    assert HOST_LIBRARY_NOTICE not in capfd.readouterr().err
    library.unlink()  # not built, but every kernel is in the cache now: no server starts
    (fresh_machine / "relu.ptom").unlink()
    assert cli.main(build(fresh_machine)) == 0
    err = capfd.readouterr().err
    assert "fell back (cached)" in err and HOST_LIBRARY_NOTICE not in err
