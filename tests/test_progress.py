"""A build is visible while it runs and says where its time went (docs/outputs.md, "Progress
and timings"): one plain stderr line per finished kernel even when stderr is a pipe (a CI log),
stage lines, nothing with --quiet, clean JSON on stdout with `timings`, and no control character
of the model's reaching the log.

One model, built for real by the CLI in its own process (no tile search): a region that compiles
(Relu → Neg → Sigmoid) and a rank-6 region the kernel generator refuses, whose reason quotes a
tensor named with an escape sequence. The cold build is shared by the module; the rebuilds are
warm (no PyPTO compile)."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from onnx import helper

from pypto_offline import api
from pypto_offline.cli.text import StderrProgress, kernel_line
from pypto_offline.progress import TIMED_STAGES, Progress
from tests.onnx_builders import GraphBuilder

REPO = Path(__file__).resolve().parents[1]
HOSTILE = "evil\x1b[2J\n"  # clears a terminal, then forges a line of the log
COMPILED = re.compile(r"^\[(\d)/2\] region_0 Relu\+Neg\+Sigmoid: compiled \d+\.\d s "
                      r"\(tile 1x8x16x16; budget \d+ B\)$", re.M)
FELL_BACK = re.compile(r"^\[(\d)/2\] region_1 Relu\+Transpose: fell back: cannot express "
                       r"in PyPTO 0\.2\.0: rank 6 transpose of 'evil\\x1b\[2J\\n' does not "
                       r"fold to 4 axes$", re.M)
STAGES = ("importing", "planning fusion", "compiling 2 kernels with PyPTO",
          "estimating the unfused baseline", "verifying against onnxruntime",
          "writing the blob and the report")


def two_region_model(path: Path) -> Path:
    b = GraphBuilder()
    fused = b.op("Sigmoid", [b.op("Neg", [b.op("Relu", [b.input("x", [1, 8, 16, 16])])])])
    # rank 6, every axis reversed: no two stay adjacent, so it does not fold to PyPTO's 4
    deep = b.input("z", [2, 3, 2, 3, 2, 4])
    b.nodes.append(helper.make_node("Relu", [deep], [HOSTILE], name=HOSTILE))
    reversed_axes = b.op("Transpose", [HOSTILE], perm=[5, 4, 3, 2, 1, 0])
    path.write_bytes(b.model(fused, reversed_axes).SerializeToString())
    return path


def run_cli(model: Path, blob: Path, cache: Path, *options: str) -> subprocess.CompletedProcess:
    """The CLI as CI runs it: stdout and stderr are pipes, not terminals."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(model), "--target",
                           "kirin9050", "-o", str(blob), "--no-tile-search", "--cache-dir",
                           str(cache), *options],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress")
    model = two_region_model(folder / "two.onnx")
    return folder, model, run_cli(model, folder / "cold.ptom", folder / "cache", "--json")


@pytest.mark.pypto
def test_each_finished_kernel_is_a_plain_line_on_a_piped_stderr(cold):
    """On main the build printed progress only to a terminal: a CI log showed nothing for the
    whole compile."""
    _, _, done = cold
    err = done.stderr
    compiled, fell_back = COMPILED.search(err), FELL_BACK.search(err)
    assert compiled and fell_back, err
    # numbered in completion order: each number once
    assert sorted([compiled.group(1), fell_back.group(1)]) == ["1", "2"], err
    for stage in STAGES:
        assert re.search(rf"^\[ *\d+\.\d s\] {stage}$", err, re.M), (stage, err)
    assert "\r" not in err  # no running count redrawn in a log


@pytest.mark.pypto
def test_a_hostile_output_name_reaches_the_log_escaped(cold):
    _, _, done = cold
    assert "\x1b" not in done.stderr and "\x1b" not in done.stdout
    assert "evil\\x1b[2J\\n" in done.stderr


@pytest.mark.pypto
def test_json_stdout_stays_clean_and_holds_the_timings(cold):
    _, _, done = cold
    summary = json.loads(done.stdout)  # the whole stdout: no progress line mixed in
    timings = summary["timings"]
    assert set(timings) == set(TIMED_STAGES)
    assert all(isinstance(s, float) and s >= 0 for s in timings.values()), timings
    assert timings["kernels_s"] > 0 and timings["verify_s"] > 0 and timings["write_s"] > 0
    assert sum(timings.values()) <= summary["compile_seconds"] + 0.01
    assert summary["kernel_cache"] == {"hits": 0, "compiled": 1, "pypto_compiles": 1}


@pytest.mark.pypto
def test_a_rebuild_says_cache_hit_and_prints_the_timings_line(cold):
    folder, model, first = cold
    done = run_cli(model, folder / "warm.ptom", folder / "cache")
    assert re.search(r"^\[\d/2\] region_0 Relu\+Neg\+Sigmoid: cache hit$", done.stderr, re.M), \
        done.stderr
    assert FELL_BACK.search(done.stderr), done.stderr
    assert re.search(r"^  compiled in \d+\.\d s: import \d+\.\d, plan \d+\.\d, kernels \d+\.\d, "
                     r"baseline \d+\.\d, verify \d+\.\d, write \d+\.\d s; kernels 0 compiled by "
                     r"PyPTO, 1 cache hits; 0 PyPTO compiles$", done.stdout, re.M), done.stdout
    # the timings differ, the outputs do not: neither blob nor report holds them
    cold_blob = Path(json.loads(first.stdout)["blob"])
    assert (folder / "warm.ptom").read_bytes() == cold_blob.read_bytes()
    assert (folder / "warm.report.html").read_bytes() == \
        cold_blob.with_name("cold.report.html").read_bytes()


@pytest.mark.pypto
def test_quiet_prints_nothing(cold):
    folder, model, _ = cold
    done = run_cli(model, folder / "quiet.ptom", folder / "cache", "--quiet")
    assert done.stderr == "" and done.stdout == ""


class Recorder(Progress):
    def __init__(self):
        self.stages, self.kernels = [], []

    def stage(self, name):
        self.stages.append(name)

    def kernel(self, done, total, region, kernel):
        self.kernels.append((done, total, region, kernel))


@pytest.fixture(scope="module")
def recorded(cold):
    """A warm build through the API, its progress recorded."""
    folder, model, _ = cold
    recorder = Recorder()
    compiled = api.compile(model, "kirin9050", cache_dir=folder / "cache", tile_search=False,
                           progress=recorder, verify=True)
    return recorder, compiled


@pytest.mark.pypto
def test_the_api_reports_through_the_progress_protocol(recorded):
    """Stages in order, then each kernel once, numbered 1..N, with its region and record."""
    recorder, compiled = recorded
    assert recorder.stages == list(STAGES[:-1])  # the API does not write; the CLI says so
    assert [(done, total) for done, total, _, _ in recorder.kernels] == [(1, 2), (2, 2)]
    assert {(region.id, kernel.region_id, kernel.compiled, kernel.from_cache)
            for _, _, region, kernel in recorder.kernels} == \
        {("region_0", "region_0", True, True), ("region_1", "region_1", False, False)}
    assert set(compiled.timings.as_dict()) == set(TIMED_STAGES)


@pytest.mark.pypto
def test_the_api_prints_nothing_by_default(cold, capfd):
    folder, model, _ = cold
    api.compile(model, "kirin9050", cache_dir=folder / "cache", tile_search=False)
    assert capfd.readouterr() == ("", "")


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.pypto
def test_on_a_terminal_the_running_count_is_wiped_before_each_line(recorded):
    """Kernel lines stay whole lines on a terminal too; only the count between them is redrawn,
    and it is gone when the build ends."""
    recorder, _ = recorded
    screen = Terminal()
    progress = StderrProgress(screen)
    first, last = recorder.kernels
    progress.kernel(*first)
    assert screen.getvalue().endswith("\n[1/2] kernels finished")
    progress.kernel(*last)
    progress.close()
    text = screen.getvalue()
    wiped = text.split("\r\x1b[K")
    assert len(wiped) == 2 and wiped[0].endswith("\n[1/2] kernels finished")
    assert wiped[1] == kernel_line(*last) + "\n"  # the last kernel: no count left behind
    assert "\x1b[2J" not in text  # the model's escape sequence is not written raw


def test_a_re_planned_build_counts_the_compiles_of_its_first_plan():
    """Found on ppocrv4_rec: a build whose matmuls are split from their epilogue compiles a
    second plan whose kernels the first plan's compiles put in the cache; it said 0 PyPTO
    compiles and 48 cache hits on a cold cache. The counts are over both plans: a kernel from
    an entry this build made is compiled, not a hit."""
    from pypto_offline.offline_compiler.build import BuildResult
    from pypto_offline.pypto_kernels.records import Kernel

    first = (Kernel("r0", True, cache_key="a", pypto_compiles=3),
             Kernel("r1", False, "PyPTO compile failed: epilogue", cache_key="m", pypto_compiles=2))
    second = (Kernel("r0", True, cache_key="a", from_cache=True),
              Kernel("r2", True, cache_key="b", from_cache=True),  # made by an earlier build
              Kernel("r3", True, cache_key="c", pypto_compiles=1))
    result = BuildResult(None, None, None, second, replaced=first)
    assert result.kernel_cache() == {"hits": 1, "compiled": 2, "pypto_compiles": 6}
    assert BuildResult(None, None, None, second).kernel_cache() == {
        "hits": 2, "compiled": 1, "pypto_compiles": 1}


def test_a_region_of_240_ops_is_one_short_progress_line():
    """Issue 34, row 19: the line joined every op type of the region, 1,400 characters for a
    region of 240 ops. Past a few ops it names the first ones and counts them all; a short
    region is still named whole."""
    from types import SimpleNamespace

    from pypto_offline.fusion.records import RegionOp
    from pypto_offline.pypto_kernels.records import Kernel

    kinds = ("Add", "Mul", "Relu", "Neg", "Sigmoid", "Abs")
    ops = [RegionOp(kinds[i % len(kinds)], (f"t{i}",), (f"t{i + 1}",)) for i in range(240)]
    region = SimpleNamespace(id="region_3", original=ops)
    hit = Kernel("region_3", True, cache_key="k", from_cache=True)
    assert kernel_line(7, 9, region, hit) == "[7/9] region_3 Add+Mul+Relu+… (240 ops): cache hit"
    fell_back = Kernel("region_3", False, "x" * 1000)
    line = kernel_line(8, 9, region, fell_back)
    assert line.startswith("[8/9] region_3 Add+Mul+Relu+… (240 ops): fell back: xxx")
    assert len(line) < 300, len(line)  # the reason is cut at 240 characters too
    short = SimpleNamespace(id="region_4", original=ops[:3])
    assert kernel_line(9, 9, short, hit) == "[9/9] region_4 Add+Mul+Relu: cache hit"
