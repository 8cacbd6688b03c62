"""A build's bytes depend on its model and options only: not on the hash seed of the process that
runs the build, nor on another build running at the same time (docs/determinism.md).

The parent process generates everything a PyPTO worker compiles (the plan, each region's
argument order, the kernel source of every tile candidate and of every single op of the unfused
baseline); the first tests check that text across hash seeds without compiling, the next ones
build a rotary embedding cold through the command line, and the last one checks that a task
list PyPTO's emulator wrote twice ships once."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.test_fusion_anchors import rotary
from tests.test_reliability import finished

REPO = Path(__file__).resolve().parent.parent
HASH_SEEDS = ("0", "1", "12345", "999")
DECODER = "tf_llama_decoder_kv"  # a corpus decoder with rotary embeddings and a KV cache
TARGET = "kirin9050"


def parent_output(model: str, input_shapes: dict | None = None) -> dict:
    """Everything the parent hands to PyPTO workers for ``model``, as JSON-able text: the
    compiled graph, each region's members, boundary and program, and the module text of every
    tile candidate of the region and of each of its single ops (the unfused baseline)."""
    from pypto_offline import import_model
    from pypto_offline.fusion import plan_fusion
    from pypto_offline.pypto_kernels.codegen import CannotExpress
    from pypto_offline.pypto_kernels.baseline import single_op_regions
    from pypto_offline.pypto_kernels.compiler import distinct_sources, kernel_interface
    from pypto_offline.pypto_kernels.search import largest_tensor_bytes
    from pypto_offline.pypto_kernels.tiling import candidate_policies
    from pypto_offline.targets import TARGETS

    target = TARGETS[TARGET]
    graph = import_model(model, input_shapes)
    plan = plan_fusion(graph, target)
    constants = graph.constant_values()

    def sources(region):
        policies = candidate_policies(target.ub_plan_bytes.value, largest_tensor_bytes(region))
        try:
            return {p.name: text for p, text in distinct_sources(region, policies, constants).items()}
        except CannotExpress as why:
            return f"cannot express: {why}"

    return {
        "compiled_model": plan.compiled_model.SerializeToString(deterministic=True).hex(),
        "unfused": [repr(u) for u in plan.unfused],
        "regions": [{
            "id": r.id, "nodes": r.nodes, "inputs": r.inputs, "outputs": r.outputs,
            "simplified": [repr(op) for op in r.simplified], "rules": r.rules_applied,
            "interface": kernel_interface(r, constants), "sources": sources(r),
            "single_ops": {s.id: [s.inputs, s.outputs, sources(s)]
                           for s in single_op_regions(r, graph)},
        } for r in plan.regions]}


def parent_outputs_with_seeds(seeds, model: str, input_shapes: dict | None) -> list[dict]:
    """``parent_output`` in a fresh interpreter per seed, started with PYTHONHASHSEED=seed, all
    at once (each is one process of its own: running them side by side halves the wait)."""
    code = ("import json, sys; from tests.test_trust_determinism import parent_output; "
            "print(json.dumps(parent_output(sys.argv[1], json.loads(sys.argv[2])), default=list))")
    running = [subprocess.Popen([sys.executable, "-c", code, model, json.dumps(input_shapes)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO, env=_env(seed)) for seed in seeds]
    outputs = []
    for process in running:
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, err[-3000:]
        outputs.append(json.loads(out))
    return outputs


def _env(seed: str) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path}


def assert_same_across_seeds(model: str, input_shapes: dict | None = None) -> dict:
    first, *others = parent_outputs_with_seeds(HASH_SEEDS, model, input_shapes)
    assert first["regions"], "the model must fuse something for the check to mean anything"
    for seed, other in zip(HASH_SEEDS[1:], others):
        for mine, theirs in zip(first["regions"], other["regions"]):
            assert mine == theirs, f"region {mine['id']} differs between hash seeds 0 and {seed}"
        assert first == other, f"the plan differs between hash seeds 0 and {seed}"
    return first


@pytest.fixture(scope="module")
def rotary_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rotary") / "rotary.onnx"
    onnx.save(rotary(), path)
    return path


def test_rotary_plan_and_kernel_sources_are_the_same_whatever_the_hash_seed(rotary_model):
    output = assert_same_across_seeds(str(rotary_model))
    (region,) = output["regions"]
    assert isinstance(region["sources"], dict) and len(region["single_ops"]) >= 5


def test_decoder_plan_and_kernel_sources_are_the_same_whatever_the_hash_seed():
    from bench import corpus

    path = corpus.model_path(DECODER)  # raises CorpusError with the reason when unavailable
    output = assert_same_across_seeds(str(path), corpus.MODELS[DECODER].input_shapes)
    assert len(output["regions"]) >= 10


def build_process(model: Path, out: Path, cache: Path, seed: str) -> subprocess.Popen:
    """A cold command-line build in its own process, with its own hash seed."""
    return subprocess.Popen(
        [sys.executable, "-m", "pypto_offline", str(model), "--target", TARGET, "-o", str(out),
         "--cache-dir", str(cache), "--no-tile-search", "--json", "--no-report"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env(seed))


def builds_at_once(specs) -> list[dict]:
    """Start every (model, blob, cache, seed) build, then wait for all of them."""
    processes = [build_process(*spec) for spec in specs]
    return [finished(process) for process in processes]


@pytest.fixture(scope="module")
def rotary_blobs(rotary_model, tmp_path_factory) -> dict[str, tuple[bytes, dict]]:
    """The rotary model built cold four times: two builds at once with different hash seeds and
    caches of their own, then two at once with different hash seeds sharing one cache."""
    folder = tmp_path_factory.mktemp("rotary_builds")
    runs = {"own_cache_seed_1": ("1", folder / "cache1"),
            "own_cache_seed_2": ("2", folder / "cache2"),
            "shared_cache_seed_3": ("3", folder / "shared"),
            "shared_cache_seed_12345": ("12345", folder / "shared")}
    results = {}
    for pair in (list(runs)[:2], list(runs)[2:]):
        summaries = builds_at_once([(rotary_model, folder / f"{name}.ptom", runs[name][1],
                                     runs[name][0]) for name in pair])
        results.update({name: ((folder / f"{name}.ptom").read_bytes(), summary)
                        for name, summary in zip(pair, summaries)})
    return results


@pytest.mark.pypto
def test_cold_builds_with_different_hash_seeds_at_once_give_identical_blobs(rotary_blobs):
    blobs = {name: blob for name, (blob, _) in rotary_blobs.items()}
    reference = blobs["own_cache_seed_1"]
    assert all(blob == reference for blob in blobs.values()), \
        {name: len(blob) for name, blob in blobs.items()}
    summary = rotary_blobs["own_cache_seed_1"][1]
    assert summary["pypto"]["compiled"] == 1 and summary["kernel_cache"]["compiled"] >= 1



def test_a_task_list_the_emulator_wrote_twice_ships_once(tmp_path):
    """PyPTO's emulator now and then writes dyn_topo.txt's task list twice (on a loaded machine:
    3 checked compiles in 18 cold tf_swin builds); the artifact keeps one list, and a list
    with no repeat is kept as written."""
    from pypto_offline.pypto_kernels import program_figures

    header = "seqNo,taskId,rootIndex,rootHash,opmagic,leafIndex,leafHash,coreType,psgId,\n"
    tasks = ["0,0,0,65,10000,1,155,0,0,,1\n", "0,1,0,65,10001,2,156,0,0,\n"]
    for written, kept in ((header + "".join(tasks * 2), header + "".join(tasks)),
                          (header + "".join(tasks), header + "".join(tasks)),
                          (header + tasks[0] + tasks[0] + tasks[1], None), (header, header)):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "dyn_topo.txt").write_text(written)
        program_figures.keep_artifacts(run, run / "kept", {})
        assert (run / "kept" / "dyn_topo.txt").read_text() == (kept or written)


PYPTO_RUN_FOLDER = """
import os, sys
from pypto import pypto_impl
os.environ["TILE_FWK_OUTPUT_DIR"] = sys.argv[1]
pypto_impl.ResetLog("")
print(os.listdir(sys.argv[1])[0])
"""


@pytest.mark.pypto
def test_pypto_in_a_worker_sees_no_host_address(tmp_path):
    """PyPTO ends its run folders' names with the host's IPv4 address (8 hex digits, or nothing
    without one), which moves its op numbers (docs/determinism.md, "The host's address"): with
    the fork server's preloaded library every host names them alike, ``output_<time>_<pid>_``."""
    from pypto_offline.pypto_kernels import no_host_address
    from pypto_offline.pypto_kernels.jobs.processes import worker_environment

    library = no_host_address.build(tmp_path)
    environment = no_host_address.preloaded(worker_environment(), library)
    assert environment["LD_PRELOAD"].split(os.pathsep)[0] == str(library)
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, "-c", PYPTO_RUN_FOLDER, str(tmp_path / "run")],
                          capture_output=True, text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    name = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"output_\d{8}_\d{6}_\d{6}_\d+_", name), name  # no address after the pid
