"""The reference runtime (offline_compiler/execute.py, docs/runtime.md "The reference runtime:
how a kernel runs on the host"): a blob's compiled graph executed with every kernel by its
shipped PyPTO program, the ops left out by onnxruntime; or every kernel as its ops."""
from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from pypto_offline import api, cli
from pypto_offline.offline_compiler.execute import BY_ONNXRUNTIME, BY_PYPTO
from pypto_offline.runtime import run_model
from tests.cache_entries import warm_cache
from tests.executors import ScriptedExecutor, figures
from tests.malformed import EXAMPLE
from tests.test_gears import two_branches

SHAPE = (1, 3, 64, 64)


def example_input(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)}


def assert_outputs_equal(actual: dict, expected: dict) -> None:
    assert list(actual) == list(expected)
    for name, want in expected.items():
        assert actual[name].dtype == want.dtype and actual[name].shape == want.shape, name
        np.testing.assert_allclose(actual[name], want, rtol=0, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def example_blob(tmp_path_factory, example_cache):
    """The example built warm from a copy of the model, the copy deleted after the build: the
    blob alone is left."""
    folder = tmp_path_factory.mktemp("run-example")
    model, blob_path = folder / "example.onnx", folder / "example.ptom"
    shutil.copy(EXAMPLE, model)
    cache = warm_cache(example_cache, folder)
    assert cli.main([str(model), "--target", "kirin9050", "--input-shape", "x=1,3,64,64",
                     "-o", str(blob_path), "--no-report", "--quiet", "--cache-dir",
                     str(cache)]) == 0
    model.unlink()
    return {"blob": blob_path, "cache": cache}


@pytest.mark.pypto
def test_the_example_run_with_kernels_by_pypto_equals_onnxruntime_on_the_original(
        example_blob):
    inputs = example_input()
    expected = run_model(onnx.load(EXAMPLE), inputs)
    compiled = api.load(example_blob["blob"])
    started = time.perf_counter()
    execution = compiled.execute(inputs, cache_dir=example_blob["cache"])
    print(f"the example, kernels by PyPTO: {time.perf_counter() - started:.2f} s host "
          f"({execution.seconds:.2f} s in execute)")
    assert execution.kernels and all(k.by == BY_PYPTO and not k.why for k in execution.kernels)
    assert all(k.seconds and k.seconds > 0 for k in execution.kernels)
    assert_outputs_equal(execution.outputs, expected)


@pytest.mark.pypto
def test_a_blob_runs_alone_without_the_onnx_model_it_was_built_from(example_blob):
    """The model file is gone (the fixture deleted it): the blob's graph, kernels and
    constants are all the run reads. A second input, a second run: another result, equal
    again to the original's."""
    assert not (example_blob["blob"].parent / "example.onnx").exists()
    inputs = example_input(seed=1)
    execution = api.load(example_blob["blob"]).execute(inputs, cache_dir=example_blob["cache"])
    assert [k.by for k in execution.kernels] == [BY_PYPTO]
    assert_outputs_equal(execution.outputs, run_model(onnx.load(EXAMPLE), inputs))


@pytest.mark.pypto
def test_a_two_gear_blob_runs_each_gear_by_pypto_equal_to_the_original(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(two_branches(), model)
    shapes = [{"x": [1, 64], "z": [1, 64]}, {"x": [4, 64], "z": [1, 64]}]
    api.compile(model, cache_dir=tmp_path / "cache", gears=shapes,
                tile_search=False).save(tmp_path / "m.ptom")
    compiled = api.load(tmp_path / "m.ptom")
    rng = np.random.default_rng(0)
    for index, gear in enumerate(shapes):
        inputs = {name: rng.standard_normal(shape).astype(np.float32)
                  for name, shape in gear.items()}
        execution = compiled.execute(inputs, cache_dir=tmp_path / "cache")
        assert execution.gear == index
        assert [k.by for k in execution.kernels] == [BY_PYPTO, BY_PYPTO], execution.kernels
        assert_outputs_equal(execution.outputs, run_model(onnx.load(model), inputs))


def scripted_example(folder):
    """The example's blob with its kernel claimed compiled by a made-up worker answer (its
    source is the generator's; PyPTO never ran it): a blob with a kernel call, in the fast
    tier."""
    def made_up(policy, job, job_folder) -> dict:
        return dict(compiled=True, aicore_us=1.0, total_us=2.0, tasks=4, ub_bytes=1024,
                    verdicts=({"pass": "tensor_graph", "result": "PASS"},),
                    max_abs_diff=0.0, magnitude=1.0, gm_bytes={"read": 1, "written": 1})
    api.compile(EXAMPLE, input_shapes={"x": list(SHAPE)}, cache_dir=folder / "cache",
                executor=ScriptedExecutor(figures(made_up)),
                tile_search=False).save(folder / "example.ptom")
    return api.load(folder / "example.ptom")


def test_kernels_as_their_ops_need_no_pypto_and_give_the_same_outputs(tmp_path):
    """Fast tier (PyPTO hidden): kernels="onnxruntime" runs each kernel as its ops, and
    kernels="pypto" where no PyPTO worker can start falls back to the same, saying why."""
    compiled = scripted_example(tmp_path)
    assert [k.compiled for k in compiled.message.kernels] == [True]
    inputs = example_input()
    expected = run_model(onnx.load(EXAMPLE), inputs)
    as_ops = compiled.execute(inputs, kernels=BY_ONNXRUNTIME)
    assert [(k.id, k.by) for k in as_ops.kernels] == [("region_0", BY_ONNXRUNTIME)]
    assert "as asked" in as_ops.kernels[0].why
    assert_outputs_equal(as_ops.outputs, expected)
    with pytest.raises(ValueError, match="kernels must be"):
        compiled.execute(inputs, kernels="npu")


def hide_pypto_from_workers(folder, monkeypatch) -> None:
    """The fast tier's stand-in ``pypto`` (tests/conftest.py) first on the workers' path, in
    any tier: a fork server then dies at ``import pypto``. Its ``lib/configs`` is the installed
    PyPTO's (the server reads the platform files there before importing it)."""
    from tests.conftest import HIDDEN_PYPTO

    stand_in = folder / "hidden"
    shutil.copytree(HIDDEN_PYPTO / "pypto", stand_in / "pypto")
    installed = importlib.util.find_spec("pypto")
    (stand_in / "pypto" / "lib").mkdir()
    os.symlink(Path(list(installed.submodule_search_locations)[0]) / "lib" / "configs",
               stand_in / "pypto" / "lib" / "configs")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(stand_in), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))


def test_a_kernel_no_pypto_worker_can_run_runs_as_its_ops_saying_why(tmp_path, monkeypatch):
    """kernels="pypto" (the default) where the PyPTO worker cannot start: the kernel runs as
    its ops in onnxruntime, its KernelRun saying why, and the outputs are still right."""
    compiled = scripted_example(tmp_path)
    hide_pypto_from_workers(tmp_path, monkeypatch)
    inputs = example_input()
    execution = compiled.execute(inputs, cache_dir=tmp_path / "cache")
    (run,) = execution.kernels
    assert run.by == BY_ONNXRUNTIME and run.seconds is None, run
    assert run.why.startswith("no PyPTO worker starts here") and \
        "PyPTO is hidden in the fast tier" in run.why, run.why
    assert_outputs_equal(execution.outputs, run_model(onnx.load(EXAMPLE), inputs))


def test_a_kernel_whose_source_is_not_the_generator_s_runs_as_its_ops(tmp_path):
    """A blob is hostile input and a kernel's source is Python: only the source the generator
    writes for the kernel's region and tile runs (verify's check); another runs as its ops,
    saying why, and no worker starts (no cache folder is even staged)."""
    compiled = scripted_example(tmp_path)
    kernel = compiled.message.kernels[0]
    kernel.source = kernel.source.replace("import pypto", "import os; import pypto", 1)
    inputs = example_input()
    execution = compiled.execute(inputs, cache_dir=tmp_path / "unused")
    (run,) = execution.kernels
    assert run.by == BY_ONNXRUNTIME, run
    assert run.why.startswith("its shipped source is not run: its source is not the one the "
                              "generator writes"), run.why
    assert not (tmp_path / "unused").exists()
    assert_outputs_equal(execution.outputs, run_model(onnx.load(EXAMPLE), inputs))


def test_a_job_asking_for_its_outputs_says_so_and_every_other_job_reads_as_before():
    """``Job.save_outputs`` is written only when set: a build's job.json (and the cache keys
    made from its text) is unchanged."""
    from pypto_offline.pypto_kernels.jobs.protocol import Job

    job = Job("kernel", True, ())
    assert "save_outputs" not in job.to_json()
    asked = Job("kernel", True, (), save_outputs=True)
    assert Job.from_dict(asked.to_dict()) == asked and asked.to_dict()["save_outputs"] is True


@pytest.mark.pypto
def test_a_force_fp16_blob_run_by_pypto_holds_its_mode_s_thresholds(tmp_path, example_cache):
    """A converted blob's run (kernels by their fp16 PyPTO programs) against onnxruntime on the
    original fp32 model: held to the mode's thresholds (cosine and relative distance,
    docs/precision.md), as its build's check is, since fp16 cannot equal fp32 to 1e-5."""
    from pypto_offline.runtime import precision_metrics
    from pypto_offline.verify import Thresholds

    model, blob_path = tmp_path / "example.onnx", tmp_path / "example.ptom"
    shutil.copy(EXAMPLE, model)
    cache = warm_cache(example_cache, tmp_path)
    assert cli.main([str(model), "--target", "kirin9050", "--input-shape", "x=1,3,64,64",
                     "--precision_mode", "force_fp16", "-o", str(blob_path), "--no-report",
                     "--quiet", "--cache-dir", str(cache)]) == 0
    model.unlink()
    inputs = example_input(seed=2)
    execution = api.load(blob_path).execute(inputs, cache_dir=cache)
    assert execution.kernels and all(k.by == BY_PYPTO for k in execution.kernels)
    expected = run_model(onnx.load(EXAMPLE), inputs)
    thresholds = Thresholds.of("force_fp16")
    for name, want in expected.items():
        metrics = precision_metrics(want, execution.outputs[name].astype(want.dtype))
        assert thresholds.holds(metrics), (name, metrics)
