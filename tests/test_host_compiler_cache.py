"""PyPTO's host g++ step cached by content inside the kernel cache (docs/kernel-cache.md, "The
host g++ cache"): replayed byte for byte, a damaged entry is a miss, a failure is never stored."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pypto_offline.pypto_kernels import compile_kernels
from pypto_offline.pypto_kernels import host_compiler_cache as host
from pypto_offline.pypto_kernels.cache import (KernelCache, cache_root_of, entry_folders,
                                               verified_files)
from pypto_offline.targets import TARGETS
from tests.fusion_helpers import fuse
from tests.onnx_builders import GraphBuilder

PYPTO_INCLUDE = Path(__import__("importlib.util").util.find_spec("pypto").origin).parent / "lib"
# PyPTO 0.2.0's own host compile of the control flow, as traced (docs/kernel-cache.md)
PYPTO_FLAGS = ["-fPIC", "-fno-stack-protector", "-O2", "-mno-sse2", "-mno-sse",
               f"-I{PYPTO_INCLUDE}/../include/tile_fwk", f"-I{PYPTO_INCLUDE}/include/",
               f"-I{PYPTO_INCLUDE}/../include/tile_fwk/tilefwk"]
SOURCE = """#include <stdint.h>
#include "local.h"
#include "tilefwk/aicpu_runtime.h"
#warning quoting the source path
const char *where = __FILE__;
uint64_t scaled(uint64_t x) { return x * LOCAL + 1; }
"""


def relu_neg_sigmoid():
    b = GraphBuilder()
    x = b.input("x", [1, 8, 16, 16])
    return fuse(b.model(b.op("Sigmoid", [b.op("Neg", [b.op("Relu", [x])])])))


def host_log(cache: Path, key: str) -> list[str]:
    """What the g++ wrapper recorded in the kernel's worker jobs, kept in its entry."""
    entry = KernelCache(cache).entry(key)
    return [line.split()[0] for job in ("search", "final") if (entry / job / host.LOG).exists()
            for line in (entry / job / host.LOG).read_text().splitlines()]


@pytest.fixture(scope="module")
def miss_then_hit(tmp_path_factory):
    """A kernel compiled with no g++ entry, then compiled again (its kernel entry and its PyPTO
    compile entries removed, the g++ entries kept): the second build replays every host compile."""
    cache = tmp_path_factory.mktemp("host-cxx") / "cache"
    graph, plan = relu_neg_sigmoid()
    (missed,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=cache, search=False)
    first_log = host_log(cache, missed.cache_key)
    for entry in entry_folders(cache):
        shutil.rmtree(entry)
    (hit,) = compile_kernels(graph, plan, TARGETS["kirin9050"], cache_dir=cache, search=False)
    return missed, first_log, hit, host_log(cache, hit.cache_key)


@pytest.mark.pypto
def test_a_replayed_host_compile_ships_the_same_kernel(miss_then_hit):
    missed, first_log, hit, second_log = miss_then_hit
    assert missed.compiled and hit.compiled and not hit.from_cache, hit.fallback_reason
    # the first job compiled the control flow and its expression table; every later one replayed
    assert first_log[:2] == ["miss", "miss"] and set(first_log[2:]) <= {"hit"}
    assert second_log == ["hit"] * len(first_log)
    assert hit.artifacts == missed.artifacts and "control_flow_host.cpp" in hit.artifacts
    same = ("cache_key", "tuned_tile", "default_tile", "functional_ok", "max_abs_diff",
            "verdicts", "gm_bytes_read", "gm_bytes_written")
    assert {f: getattr(hit, f) for f in same} == {f: getattr(missed, f) for f in same}


def wrapper_job(tmp_path: Path, name: str, source: str = SOURCE) -> tuple[Path, Path]:
    """A job folder with a g++ wrapper on the given cache, and a source in a folder of its own
    (as PyPTO's ``run/output_<time>/kernel_aicpu``)."""
    job = tmp_path / name
    sources = job / "run" / "kernel_aicpu"
    sources.mkdir(parents=True)
    (sources / "control.cpp").write_text(source)
    (sources / "local.h").write_text("#define LOCAL 3\n")
    assert host.write_wrapper(job, tmp_path / "cache") == job / host.WRAPPER_FOLDER
    return job, sources / "control.cpp"


def host_compile(job: Path, source: Path, compiler: str | None = None):
    compiler = compiler or str(job / host.WRAPPER_FOLDER / "g++")
    return subprocess.run([compiler, *PYPTO_FLAGS, "-S", str(source), "-o", f"{source}.s"],
                          cwd=job, capture_output=True)


def entries(cache: Path) -> list[Path]:
    return [e for e in (cache / host.SUBFOLDER).glob("??/*") if e.is_dir()]


@pytest.mark.pypto
def test_a_hit_writes_what_the_compiler_writes_in_that_job(tmp_path):
    """Another job folder (as in every build): the key does not see it, and the output and
    messages name this job's source, as the real g++ run here would."""
    first, first_source = wrapper_job(tmp_path, "first")
    second, second_source = wrapper_job(tmp_path, "second")
    assert host_compile(first, first_source).returncode == 0
    replayed = host_compile(second, second_source)
    assert replayed.returncode == 0
    assert (second / host.LOG).read_text().split()[0] == "hit"
    replayed_output = Path(f"{second_source}.s").read_bytes()
    real = host_compile(second, second_source, shutil.which("g++"))  # overwrites it
    assert real.returncode == 0
    assert replayed_output == Path(f"{second_source}.s").read_bytes()
    assert str(second_source).encode() in replayed_output  # through __FILE__
    assert replayed.stderr == real.stderr and b"warning" in real.stderr


@pytest.mark.pypto
def test_a_changed_header_is_a_miss(tmp_path):
    job, source = wrapper_job(tmp_path, "job")
    assert host_compile(job, source).returncode == 0
    (source.parent / "local.h").write_text("#define LOCAL 5\n")
    assert host_compile(job, source).returncode == 0
    assert [line.split()[0] for line in (job / host.LOG).read_text().splitlines()] == \
        ["miss", "miss"]
    assert len(entries(tmp_path / "cache")) == 2


@pytest.mark.pypto
def test_a_damaged_host_compiler_entry_is_a_miss_and_is_replaced(tmp_path):
    job, source = wrapper_job(tmp_path, "job")
    assert host_compile(job, source).returncode == 0
    good = Path(f"{source}.s").read_bytes()
    (entry,) = entries(tmp_path / "cache")
    (entry / "output").write_bytes(b"\t.text\n")  # an edited output: its manifest says otherwise
    done = host_compile(job, source)
    assert done.returncode == 0 and b"is damaged" in done.stderr
    assert Path(f"{source}.s").read_bytes() == good
    assert (job / host.LOG).read_text().split("\n")[1].startswith("miss")
    assert verified_files(entry, entry.name)["output"] != b"\t.text\n"  # replaced, and sound
    assert host_compile(job, source).returncode == 0
    assert (job / host.LOG).read_text().splitlines()[-1].startswith("hit")


def test_a_failing_host_compile_is_not_cached(tmp_path):
    job, source = wrapper_job(tmp_path, "job", SOURCE + "int broken( {\n")
    for _ in range(2):  # the second call compiles (and fails) again: nothing was stored
        done = host_compile(job, source)
        assert done.returncode != 0 and b"error" in done.stderr
        assert not Path(f"{source}.s").exists()
    assert entries(tmp_path / "cache") == [] and not (job / host.LOG).exists()


@pytest.mark.pypto
def test_only_plain_source_compiles_are_cached(tmp_path):
    """PyPTO also calls g++ to assemble the .s (-c); that, and a compile whose output names its
    folder (-g), run the real compiler untouched."""
    job, source = wrapper_job(tmp_path, "job")
    wrapper = str(job / host.WRAPPER_FOLDER / "g++")
    for extra in (["-g"], []):
        done = subprocess.run([wrapper, *PYPTO_FLAGS, *extra, "-S", str(source), "-o",
                               f"{source}.s"], cwd=job, capture_output=True)
        assert done.returncode == 0
    assemble = subprocess.run([wrapper, "-c", f"{source}.s", "-o", f"{source}.o"], cwd=job)
    assert assemble.returncode == 0 and Path(f"{source}.o").stat().st_size > 0
    assert (job / host.LOG).read_text().split()[0] == "miss"  # the plain compile only
    assert len(entries(tmp_path / "cache")) == 1


def test_the_wrapper_forwards_to_the_real_compiler_not_to_a_wrapper(tmp_path):
    """Neither its own folder nor another job's wrapper (inherited on PATH) is the compiler."""
    other, _ = wrapper_job(tmp_path, "other")
    job = tmp_path / "job"
    job.mkdir()
    path = os.pathsep.join([str(job / host.WRAPPER_FOLDER), str(other / host.WRAPPER_FOLDER),
                            os.environ["PATH"]])
    tools = host.write_wrapper(job, tmp_path / "cache", path=path)
    text = (tools / "g++").read_text()
    assert f"exec {shutil.which('g++')} " in text and host.WRAPPER_FOLDER + "/g++" not in text


def test_a_job_staged_in_a_kernel_cache_knows_that_cache(tmp_path):
    cache = KernelCache(tmp_path / "kernels")
    assert cache_root_of(cache.staging() / "final") == cache.root
    assert cache_root_of(tmp_path / "elsewhere") is None


@pytest.mark.pypto
def test_a_cache_that_cannot_be_used_leaves_the_compile_to_the_real_compiler(tmp_path):
    """A failure of the cache must not fail PyPTO's compile: that would be stored in the kernel
    cache as the kernel's compile error."""
    job, source = wrapper_job(tmp_path, "job")
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    (tmp_path / "cache").write_text("a file where the cache should be")
    done = host_compile(job, source)
    assert done.returncode == 0 and b"host compiler cache is not used" in done.stderr
    replaced = Path(f"{source}.s").read_bytes()
    assert host_compile(job, source, shutil.which("g++")).returncode == 0
    assert replaced == Path(f"{source}.s").read_bytes()


# --- the precompiled header -------------------------------------------------------------------

# The two sources of one real PyPTO 0.2.0 host compile (tf_swin's first region: Add, Reshape,
# Transpose) with the two headers PyPTO writes beside them, as PyPTO wrote them.
REAL_SOURCES = Path(__file__).parent / "data" / "pypto_host_sources"


def host_log_lines(job: Path) -> list[list[str]]:
    return [line.split() for line in (job / host.LOG).read_text().splitlines()]


def precompiled_miss(line: list[str]) -> bool:
    """A log line ``miss <seconds> precompiled <output> <key>``."""
    return line[0] == "miss" and line[2] == "precompiled"


def pch_entries(cache: Path) -> list[Path]:
    return [e for e in (cache / host.PCH_SUBFOLDER).glob("??/*") if e.is_dir()]


def test_the_prologue_holds_the_defines_and_the_headers_from_outside_the_source_folder(tmp_path):
    (tmp_path / "expression_0.h").write_text("#define VALUE 1\n")
    text = ('#define __TILE_FWK_AICPU__ 1\n#include <stdint.h>\n\n#include "expression_0.h"\n'
            '#include "tilefwk/aicpu_runtime.h"\n// a comment\n#if VALUE\n#include <vector>\n'
            '#endif\nint x;\n')
    assert host.precompiled_prologue(text, tmp_path) == (
        '#define __TILE_FWK_AICPU__ 1\n#include <stdint.h>\n#include "tilefwk/aicpu_runtime.h"\n')
    assert host.precompiled_prologue('#include "expression_0.h"\nint x;\n', tmp_path) is None
    assert host.precompiled_prologue("#define A 1\nint x;\n", tmp_path) is None


@pytest.mark.pypto
@pytest.mark.parametrize("name", ["controlFlow_host_6493229403676378844.cpp",
                                  "control_flow_expr_table_0_0.cpp"])
def test_pypto_sources_compile_through_the_precompiled_header_to_the_same_output(tmp_path, name):
    """PyPTO's own sources: through the precompiled header (its system and PyPTO headers read
    before the source's own expression_0.h) the output is what the plain compile writes."""
    job = tmp_path / "job"
    shutil.copytree(REAL_SOURCES, job / "run" / "kernel_aicpu")
    host.write_wrapper(job, tmp_path / "cache")
    source = job / "run" / "kernel_aicpu" / name
    assert host_compile(job, source).returncode == 0
    assert precompiled_miss(host_log_lines(job)[0])
    through_header = Path(f"{source}.s").read_bytes()
    assert host_compile(job, source, shutil.which("g++")).returncode == 0
    assert Path(f"{source}.s").read_bytes() == through_header
    (entry,) = pch_entries(tmp_path / "cache")
    assert (entry / f"{host.PCH_HEADER}.gch").stat().st_size > 1_000_000


@pytest.mark.pypto
def test_one_precompiled_header_serves_every_source_with_that_prologue(tmp_path):
    """Other jobs and other sources opening with the same headers: built once, then read."""
    first, first_source = wrapper_job(tmp_path, "first")
    second, second_source = wrapper_job(tmp_path, "second", SOURCE + "int other;\n")
    for job, source in ((first, first_source), (second, second_source)):
        assert host_compile(job, source).returncode == 0
        assert precompiled_miss(host_log_lines(job)[0])
    assert len(pch_entries(tmp_path / "cache")) == 1 and len(entries(tmp_path / "cache")) == 2


@pytest.mark.pypto
def test_a_damaged_precompiled_header_is_rebuilt(tmp_path):
    """A precompiled header is read back only as stored (its manifest): an edited one is a
    miss, with a warning, and a sound one replaces it; the compile's output is unchanged."""
    job, source = wrapper_job(tmp_path, "job")
    assert host_compile(job, source).returncode == 0
    (entry,) = pch_entries(tmp_path / "cache")
    gch = entry / f"{host.PCH_HEADER}.gch"
    gch.write_bytes(gch.read_bytes()[:4096])
    source.write_text(SOURCE + "int again;\n")  # another source: a miss, not a replay
    done = host_compile(job, source)
    assert done.returncode == 0 and b"is damaged" in done.stderr
    assert precompiled_miss(host_log_lines(job)[1])
    (entry,) = pch_entries(tmp_path / "cache")
    # rebuilt whole (not byte for byte the same: g++ does not write a .gch reproducibly)
    assert len(verified_files(entry, entry.name)[f"{host.PCH_HEADER}.gch"]) > 1_000_000
    through_header = Path(f"{source}.s").read_bytes()
    assert host_compile(job, source, shutil.which("g++")).returncode == 0
    assert Path(f"{source}.s").read_bytes() == through_header
