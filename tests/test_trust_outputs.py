"""Outputs and resources are checked before the work: a compile never overwrites its model or
its blob with its report, never ends by failing to write, writes blob and report as a pair, and
refuses sizes, archives and options that would exhaust the machine before running anything.
Most tests here compile nothing; those that do compile models without a fusable region (no PyPTO
kernel), so they take a second."""
from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pypto_offline import api, cli
from pypto_offline.errors import UsageError
from pypto_offline.offline_compiler import blob
from pypto_offline.runtime import run_model
from tests.onnx_builders import one_node

REPO = Path(__file__).resolve().parent.parent
TARGET = ["--target", "kirin9050"]
# The ONNX backend cases whose Reshape shape or Unsqueeze axes is a graph input: they run only
# with their real input values.
NEEDS_REAL_VALUES = ("test_reshape_reduced_dims", "test_reshape_extended_dims",
                     "test_reshape_one_dim", "test_reshape_negative_extended_dims",
                     "test_reshape_zero_dim", "test_reshape_zero_and_negative_dim",
                     "test_unsqueeze_two_axes", "test_unsqueeze_three_axes",
                     "test_unsqueeze_unsorted_axes")


def _relu_model(folder: Path, shape=(2, 3)) -> Path:
    path = folder / "model.onnx"
    onnx.save(one_node("Relu", list(shape), opset=17), path)
    return path


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _backend_case(name: str):
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next(c for c in node.collect_testcases(None) if c.name == name)
    inputs, outputs = case.data_sets[0]
    return case.model, {v.name: x for v, x in zip(case.model.graph.input, inputs)}, outputs


@pytest.fixture(scope="module")
def backend_models(tmp_path_factory):
    """name → (model path, npz of its inputs, expected outputs)."""
    folder = tmp_path_factory.mktemp("backend")
    made = {}
    for name in NEEDS_REAL_VALUES:
        model, feeds, outputs = _backend_case(name)
        onnx.save(model, folder / f"{name}.onnx")
        np.savez(folder / f"{name}.npz", **feeds)
        made[name] = (folder / f"{name}.onnx", folder / f"{name}.npz", outputs)
    return made


@pytest.fixture(scope="module")
def plain_blob(tmp_path_factory):
    """A blob of a model with no memory-bound op (one MatMul): built without any PyPTO kernel."""
    folder = tmp_path_factory.mktemp("blob")
    model = folder / "matmul.onnx"
    onnx.save(one_node("MatMul", [2, 3], opset=17,
                       params={"w": np.arange(12, dtype=np.float32).reshape(3, 4)}), model)
    out = folder / "matmul.ptom"
    assert cli.main([str(model), *TARGET, "-o", str(out), "--no-report", "--quiet"]) == 0
    return out


# --- outputs ----------------------------------------------------------------------------------

def test_output_onto_the_model_is_refused_and_the_model_untouched(tmp_path, capfd):
    model = _relu_model(tmp_path)
    before = model.read_bytes()
    for spelling in (str(model), str(tmp_path / "sub" / ".." / "model.onnx")):
        (tmp_path / "sub").mkdir(exist_ok=True)
        assert cli.main([str(model), *TARGET, "-o", spelling]) == 2
        assert "same file as the input model" in capfd.readouterr().err
    os.symlink(model, tmp_path / "link.onnx")
    assert cli.main([str(tmp_path / "link.onnx"), *TARGET, "--report", str(model)]) == 2
    assert model.read_bytes() == before
    assert _files(tmp_path) == ["link.onnx", "model.onnx", "sub"]


def test_report_onto_the_blob_is_refused(tmp_path, capfd):
    model = _relu_model(tmp_path)
    out = tmp_path / "m.ptom"
    assert cli.main([str(model), *TARGET, "-o", str(out), "--report", str(out)]) == 2
    assert "--report" in capfd.readouterr().err and _files(tmp_path) == ["model.onnx"]


def test_report_subcommand_onto_its_blob_is_refused(plain_blob, capfd):
    before = plain_blob.read_bytes()
    assert cli.main(["report", str(plain_blob), "-o", str(plain_blob)]) == 2
    assert "same file as the blob" in capfd.readouterr().err
    assert plain_blob.read_bytes() == before


def test_output_naming_a_folder_is_refused_before_compiling(tmp_path, capfd):
    model = _relu_model(tmp_path)
    (tmp_path / "out").mkdir()
    started = time.perf_counter()
    assert cli.main([str(model), *TARGET, "-o", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - started < 3, "the check came after work"
    assert "names a folder, a device or a pipe" in capfd.readouterr().err
    assert _files(tmp_path / "out") == [] and _files(tmp_path) == ["model.onnx", "out"]


def _specials(folder: Path) -> list[Path]:
    """A fifo, and a null device of our own: on a broken build the test must not replace the
    machine's /dev/null (renaming a file over it is exactly the bug)."""
    os.mkfifo(folder / "pipe")
    made = [folder / "pipe"]
    try:
        os.mknod(folder / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made.append(folder / "null")
    except PermissionError:  # not root: the fifo alone stands for every non-regular file
        pass
    return made


def test_report_onto_a_device_or_a_fifo_is_refused(tmp_path, capfd):
    model = _relu_model(tmp_path)
    for path in _specials(tmp_path):
        assert cli.main([str(model), *TARGET, "--report", str(path)]) == 2
        assert "not a file" in capfd.readouterr().err
        assert not path.is_file()
    assert "model.kirin9050.ptom" not in _files(tmp_path)


def test_an_unwritable_folder_is_refused_before_the_work(tmp_path, monkeypatch, capfd):
    model = _relu_model(tmp_path)
    real_access = os.access
    # As root os.access grants everything, so the folder's refusal is simulated at that call.
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path / "ro"
                        else real_access(path, mode))
    (tmp_path / "ro").mkdir()
    assert cli.main([str(model), *TARGET, "--report", str(tmp_path / "ro" / "r.html")]) == 2
    assert "cannot be written" in capfd.readouterr().err
    assert _files(tmp_path) == ["model.onnx", "ro"]


def test_a_pair_whose_second_file_cannot_be_staged_leaves_neither(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        blob.write_together({tmp_path / "report.html": b"page",
                             tmp_path / "missing" / "m.ptom": b"blob"})
    assert _files(tmp_path) == []


def test_a_report_that_cannot_be_made_leaves_no_blob(backend_models, tmp_path, monkeypatch):
    import pypto_offline.report

    def broken(message):
        raise RuntimeError("the template broke")

    monkeypatch.setattr(pypto_offline.report, "render_report", broken)
    model, inputs, _ = backend_models["test_reshape_reduced_dims"]
    out = tmp_path / "m.ptom"
    assert cli.main([str(model), *TARGET, "--inputs", str(inputs), "-o", str(out)]) == 3
    assert _files(tmp_path) == []  # neither the blob nor a temporary file


def test_save_with_a_report_in_a_vanished_folder_leaves_no_blob(plain_blob, tmp_path):
    compiled = api.load(plain_blob)
    with pytest.raises(UsageError, match="does not exist"):
        compiled.save(tmp_path / "m.ptom", report=tmp_path / "gone" / "m.report.html")
    assert _files(tmp_path) == []


# --- resource limits --------------------------------------------------------------------------

def _limited(command: list[str]) -> subprocess.CompletedProcess:
    """A process that cannot take more than 4 GiB of address space: where the check is missing,
    it fails on its own instead of pushing the machine out of memory."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(command, capture_output=True, text=True, preexec_fn=limit, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _constant_of_shape_model(path: Path, elements: int) -> None:
    shape = numpy_helper.from_array(np.array([elements // 1000, 1000], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
             helper.make_node("Add", ["x", "total"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_huge_constant_of_shape_is_refused_before_folding_or_probing(tmp_path):
    model = tmp_path / "big.onnx"
    _constant_of_shape_model(model, 100_000_000)
    # The importer alone (where a missing check would hold the tensor), in a process of its own
    # so that its peak memory is its own.
    # The peak is VmHWM, this process image's own: ru_maxrss survives the exec, so it would
    # report the forked pytest process's size (415 MB late in the suite).
    script = ("import re, sys\n"
              "from pypto_offline import import_model\n"
              "from pypto_offline.errors import PyptoOfflineError\n"
              "try:\n"
              f"    import_model({str(model)!r}); code = 0\n"
              "except PyptoOfflineError as error:\n"
              "    print(error, file=sys.stderr); code = 2\n"
              "status = open('/proc/self/status').read()\n"
              "print(code, int(re.search(r'VmHWM:\\s+(\\d+)', status).group(1)) // 1024)\n")
    started = time.perf_counter()
    done = _limited([sys.executable, "-c", script])
    code, peak_mb = map(int, done.stdout.split())
    assert code == 2, done.stderr
    assert "needs 381.5 MiB" in done.stderr and "'big'" in done.stderr
    # The 400 MB tensor was never made (folding and the probe would each hold it at least once).
    assert peak_mb < 390, f"peak RSS {peak_mb} MB"
    assert time.perf_counter() - started < 60
    assert _files(tmp_path) == ["big.onnx"]


def test_a_huge_input_shape_is_refused_with_the_memory_it_needs(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(one_node("Relu", ["a", "b", "c"], opset=17), model)
    done = _limited([sys.executable, "-m", "pypto_offline", str(model), *TARGET,
                     "--input-shape", "x=1000,1000,2000"])
    assert done.returncode == 2, done.stderr
    assert "[1000, 1000, 2000] (float32) needs 7.45 GiB" in done.stderr
    assert "input 'x'" in done.stderr


@pytest.mark.parametrize("option", [["--kernel-timeout", "nan"], ["--kernel-timeout", "inf"],
                                    ["--jobs", "10000"],
                                    # issue 34 row 12: on cb4dc9a an OverflowError, exit 3
                                    ["--kernel-timeout", "1e12"]])
def test_resource_options_out_of_range_are_refused(option, tmp_path, capfd):
    model = _relu_model(tmp_path)
    assert cli.main([str(model), *TARGET, *option]) == 2
    assert option[0] in capfd.readouterr().err
    assert _files(tmp_path) == ["model.onnx"]


# --- real inputs (.npz) -----------------------------------------------------------------------

def _compile_with_inputs(model: Path, inputs: Path) -> int:
    return cli.main([str(model), *TARGET, "--inputs", str(inputs), "--no-report"])


def test_an_npz_that_would_decompress_past_the_budget_is_refused_unread(tmp_path, monkeypatch,
                                                                         capfd):
    import pypto_offline.verify as verify

    model = _relu_model(tmp_path)
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, x=np.zeros((4, 1 << 20), np.float32))  # 16 MiB in a few KiB
    assert bomb.stat().st_size < 100_000
    monkeypatch.setattr(verify, "MAX_PROBE_BYTES", 1 << 20)
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("decompressed the bomb"))
    assert _compile_with_inputs(model, bomb) == 2
    assert "would decompress to 16.0 MiB, more than the 1.0 MiB" in capfd.readouterr().err


def test_an_npz_whose_header_claims_more_than_it_holds_is_refused(tmp_path, capfd):
    model = _relu_model(tmp_path)
    lying = tmp_path / "lying.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros((2, 3), np.float32))
    header["shape"] = (100000, 100000)
    with zipfile.ZipFile(lying, "w") as archive, archive.open("x.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, header)
        member.write(np.zeros(6, np.float32).tobytes())
    assert _compile_with_inputs(model, lying) == 2
    assert "truncated or damaged" in capfd.readouterr().err


def test_a_truncated_npz_is_refused(tmp_path, capfd):
    model = _relu_model(tmp_path)
    whole = tmp_path / "whole.npz"
    np.savez(whole, x=np.ones((2, 3), np.float32))
    cut = tmp_path / "cut.npz"
    cut.write_bytes(whole.read_bytes()[:200])
    assert _compile_with_inputs(model, cut) == 2
    assert "cannot read --inputs" in capfd.readouterr().err


@pytest.mark.parametrize("array, message", [
    (np.ones((2, 3), np.float64), "gives dtype float64, the model expects float32"),
    (np.ones((2, 3, 1), np.float32), "gives shape [2, 3, 1], the model expects [2, 3]"),
    (np.ones((3, 2), np.float32), "gives shape [3, 2], the model expects [2, 3]"),
])
def test_an_npz_of_the_wrong_dtype_or_shape_is_refused_before_compiling(array, message,
                                                                        tmp_path, capfd):
    model = _relu_model(tmp_path)
    np.savez(tmp_path / "x.npz", x=array)
    assert _compile_with_inputs(model, tmp_path / "x.npz") == 2
    assert message in capfd.readouterr().err
    assert _files(tmp_path) == ["model.onnx", "x.npz"]


def test_verify_with_a_wrong_shape_npz_is_refused_not_passed(plain_blob, tmp_path, capfd):
    np.savez(tmp_path / "wrong.npz", x=np.ones((1, 3), np.float32))  # broadcasts in numpy
    assert cli.main(["verify", str(plain_blob), "--inputs", str(tmp_path / "wrong.npz")]) == 2
    assert "gives shape [1, 3], the model expects [2, 3]" in capfd.readouterr().err


def _blob_with_graphs(plain_blob: Path, folder: Path, edit) -> Path:
    """The plain blob with ``edit(model, which)`` applied to its imported and compiled graphs,
    re-signed by the blob writer so that the reader's own checks pass (a blob is hostile)."""
    message = api.load(plain_blob).message
    for which in ("source_onnx_model", "onnx_model"):
        model = onnx.load_from_string(getattr(message, which))
        edit(model, which)
        setattr(message, which, model.SerializeToString())
    return blob.write(folder / "edited.ptom", message)


def test_verify_refuses_a_blob_declaring_a_huge_input_with_the_memory_it_needs(plain_blob,
                                                                               tmp_path):
    """Issue 34, row 8: it was a MemoryError making the inputs (exit 3)."""
    def huge_x(model, _):
        (x,) = [value for value in model.graph.input if value.name == "x"]
        del x.type.tensor_type.shape.dim[:]
        for size in (2, 4, 2_000_000_000):
            x.type.tensor_type.shape.dim.add().dim_value = size

    done = _limited([sys.executable, "-m", "pypto_offline", "verify",
                     str(_blob_with_graphs(plain_blob, tmp_path, huge_x))])
    assert done.returncode == 2, done.stderr
    assert "[2, 4, 2000000000] (float32) needs 59.60 GiB" in done.stderr
    assert "edited.ptom, its imported graph, input 'x'" in done.stderr
    assert "--input-shape" in done.stderr and len(done.stderr.splitlines()) == 1


def test_verify_refuses_a_blob_whose_compiled_graph_grows_past_the_limits(plain_blob, tmp_path):
    """Its inputs are small, but the compiled graph makes a 2.2 GiB tensor on the way (such a
    blob reached 4.2 GB of RSS before): refused before anything runs."""
    def expanded(model, which):
        if which != "onnx_model":
            return
        model.graph.initializer.append(
            numpy_helper.from_array(np.array([100_000_000, 2, 3], np.int64), "big_shape"))
        matmul = model.graph.node[-1]
        inputs = list(matmul.input)
        nodes = [helper.make_node("Expand", [inputs[0], "big_shape"], ["big"]),
                 helper.make_node("ReduceMax", ["big"], ["x_again"], axes=[0], keepdims=0),
                 helper.make_node("MatMul", ["x_again", inputs[1]], list(matmul.output))]
        del model.graph.node[:]
        model.graph.node.extend(nodes)

    done = _limited([sys.executable, "-m", "pypto_offline", "verify",
                     str(_blob_with_graphs(plain_blob, tmp_path, expanded))])
    assert done.returncode == 2, done.stderr
    assert "its compiled graph" in done.stderr and "needs 2.24 GiB" in done.stderr


# --- models that need their real inputs, or that onnxruntime cannot run -----------------------

@pytest.mark.parametrize("name", NEEDS_REAL_VALUES)
def test_a_model_whose_shapes_come_from_its_inputs_compiles_and_verifies(name, backend_models,
                                                                         tmp_path):
    model, inputs, outputs = backend_models[name]
    out = tmp_path / "m.ptom"
    assert cli.main([str(model), *TARGET, "--inputs", str(inputs), "-o", str(out),
                     "--quiet"]) == 0
    assert cli.main(["verify", str(out), "--inputs", str(inputs), "--quiet"]) == 0
    message = api.load(out).message
    assert message.verification.status == "passed" and message.verification.inputs_given
    compiled = onnx.load_from_string(message.onnx_model)
    with np.load(inputs) as data:
        got = run_model(compiled, {k: data[k] for k in data.files})
    np.testing.assert_array_equal(got[compiled.graph.output[0].name], outputs[0])


def _custom_op_model(path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Mystery", ["r"], ["y"], domain="com.example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]),
              path)


def test_a_custom_op_onnxruntime_cannot_run_is_refused_before_compiling(tmp_path, capfd):
    model = tmp_path / "custom.onnx"
    _custom_op_model(model)
    started = time.perf_counter()
    assert cli.main([str(model), *TARGET]) == 2
    err = capfd.readouterr().err
    assert "cannot be verified here" in err and "--no-verify" in err
    assert time.perf_counter() - started < 30 and _files(tmp_path) == ["custom.onnx"]
    # without the check it builds, and verifying that blob later says why it cannot
    assert cli.main([str(model), *TARGET, "--no-verify", "--quiet"]) == 0
    assert cli.main(["verify", str(tmp_path / "custom.kirin9050.ptom")]) == 2
    assert "cannot be verified here" in capfd.readouterr().err


# --- what reaches the terminal ----------------------------------------------------------------

def test_control_characters_from_a_blob_are_escaped_in_human_output(plain_blob, tmp_path,
                                                                    capfd):
    from pypto_offline.offline_compiler import ptom_pb2

    message = api.load(plain_blob).message
    message.provenance.model_name = "evil\x1b[2J.onnx"
    message.kernels.append(ptom_pb2.Kernel(
        id="k\x1b]0;title\x07", original=[ptom_pb2.Op(op_type="Relu\r\x1b[1A")],
        fallback_reason="because\x1b[31m red"))
    evil = tmp_path / "evil.ptom"
    blob.write(evil, message)
    assert cli.main(["inspect", str(evil)]) == 0
    out = capfd.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "evil\\x1b[2J.onnx" in out and "k\\x1b]0;title\\x07" in out
    assert "because\\x1b[31m red" in out
    assert cli.main(["inspect", str(evil), "--json"]) == 0  # JSON escapes on its own
    assert "\x1b" not in capfd.readouterr().out


def test_control_characters_in_an_error_are_escaped(tmp_path, capfd):
    model = tmp_path / "m\x1b[2J.onnx"
    model.write_bytes(b"not a model")
    assert cli.main([str(model), *TARGET]) == 2
    err = capfd.readouterr().err
    assert "\x1b" not in err and "m\\x1b[2J.onnx" in err


def test_a_large_weight_held_in_a_constant_node_is_not_a_computed_tensor(monkeypatch):
    """Exporters store weights as Constant nodes too: like initializers, they are in memory
    already and do not count against the per-tensor limit (scaled down here to 1 MiB)."""
    from pypto_offline import import_model
    from pypto_offline.importer import input_shapes

    monkeypatch.setattr(input_shapes, "MAX_TENSOR_BYTES", 1 << 20)
    weight = numpy_helper.from_array(np.zeros((2 << 20) // 4, np.float32), "w")  # 2 MiB
    nodes = [helper.make_node("Constant", [], ["w"], value=weight),
             helper.make_node("ReduceMax", ["w"], ["m"], keepdims=0),
             helper.make_node("Add", ["x", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert import_model(model).tensors["y"].shape == (1,)


# --- issue 34: the user's slips exit 2 before any work ---------------------------------------

def _output_dirs(folder: Path) -> dict[str, str]:
    (folder / "a-file").write_text("not a folder")
    (folder / "link-to-file").symlink_to(folder / "a-file")
    return {"a file": str(folder / "a-file"), "a link to a file": str(folder / "link-to-file"),
            "a path under a file": str(folder / "a-file" / "out"), "/dev/null": "/dev/null"}


@pytest.mark.parametrize("case", ["a file", "a link to a file", "a path under a file",
                                  "/dev/null"])
def test_an_output_dir_that_cannot_be_a_folder_is_refused(case, tmp_path, capfd):
    """Row 9: on cb4dc9a FileExistsError / NotADirectoryError, exit 3."""
    model = _relu_model(tmp_path)
    folder = _output_dirs(tmp_path)[case]
    assert cli.main([str(model), *TARGET, "--output-dir", folder]) == 2
    err = capfd.readouterr().err
    assert err.startswith("pypto-offline: error: --output-dir") and "Traceback" not in err, err
    assert (tmp_path / "a-file").read_text() == "not a folder"
    assert _files(tmp_path) == ["a-file", "link-to-file", "model.onnx"]


@pytest.mark.parametrize("option,flag", [
    (["-o", ""], "-o/--output"), (["--cache-dir", ""], "--cache-dir"),
    (["--report", " "], "--report"), (["--output-dir", ""], "--output-dir"),
    (["--executor", "ray", "--ray-address", ""], "--ray-address"),
    (["--input-shape", ""], "--input-shape"), (["--inputs", ""], "--inputs")])
def test_an_empty_option_value_is_refused(option, flag, tmp_path, capfd):
    """Row 17: on cb4dc9a an empty value meant the default, silently (an empty --ray-address
    would have started a local Ray instance)."""
    model = _relu_model(tmp_path)
    assert cli.main([str(model), *TARGET, *option]) == 2
    assert f"error: {flag} is given an empty value" in capfd.readouterr().err
    assert _files(tmp_path) == ["model.onnx"]


@pytest.mark.parametrize("argv,flag", [(["cache", "info", "--cache-dir", ""], "--cache-dir"),
                                       (["report", "b.ptom", "-o", ""], "-o/--output")])
def test_an_empty_value_is_refused_by_the_other_commands_too(argv, flag, capfd):
    assert cli.main(argv) == 2
    assert f"error: {flag} is given an empty value" in capfd.readouterr().err


def test_an_atc_input_shape_naming_no_input_is_refused(tmp_path, capfd):
    model = _relu_model(tmp_path)
    assert cli.main([str(model), *TARGET, "--input_shape", ";"]) == 2
    assert "--input_shape ';' names no input" in capfd.readouterr().err
