"""Reliability: concurrent builds sharing one kernel cache, and PyPTO compiles that crash or hang
inside a full build (the region falls back, the build finishes, the report says why)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pypto_offline
from pypto_offline import cli
from pypto_offline.pypto_kernels.cache import STAGING, entry_folders
from pypto_offline.offline_compiler.summary import fallback_category
from pypto_offline.pypto_kernels.entries import KIND_OF_FILE
from tests.malformed import EXAMPLE

SHAPE = ["--input-shape", "x=1,3,64,64"]
OTHER_MODEL = "asr_frontend_kaldi"   # a corpus model with one fused region


def cli_process(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pypto_offline", *map(str, args), "--json",
                             "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err
    return json.loads(out)


def cache_listing(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_size for p in sorted(cache.rglob("*"))
            if p.is_file()}


@pytest.mark.pypto
def test_two_builds_at_once_share_a_cache_and_a_third_compiles_nothing(tmp_path):
    from bench import corpus

    cache = tmp_path / "cache"
    other = tmp_path / f"{OTHER_MODEL}.onnx"
    shutil.copy(corpus.model_path(OTHER_MODEL), other)
    other_shapes = corpus.MODELS[OTHER_MODEL].shape_args
    first = cli_process(EXAMPLE, "--target", "kirin9050", *SHAPE, "-o", tmp_path / "a.ptom",
                        "--cache-dir", cache)
    second = cli_process(other, "--target", "kirin9050", *other_shapes, "-o",
                         tmp_path / "b.ptom", "--cache-dir", cache)
    one, two = finished(first), finished(second)
    assert one["kernel_cache"]["compiled"] >= 1 and two["kernel_cache"]["compiled"] >= 1
    assert one["verification"]["status"] == two["verification"]["status"] == "passed"
    # the cache is whole: every entry complete, no staging folder left behind
    entries = entry_folders(cache)
    assert len(entries) >= 2
    assert all(any((entry / name).is_file() for name in KIND_OF_FILE)
               for entry in entries), entries  # a kernel, one of its compiles, an op's cost
    assert not list((cache / STAGING).glob("*")), "a staging folder was left behind"
    before = cache_listing(cache)
    third = finished(cli_process(other, "--target", "kirin9050", *other_shapes, "-o",
                                 tmp_path / "c.ptom", "--cache-dir", cache))
    assert third["kernel_cache"] == {"hits": two["kernel_cache"]["compiled"], "compiled": 0,
                                     "pypto_compiles": 0}
    assert cache_listing(cache) == before
    assert (tmp_path / "c.ptom").read_bytes() == (tmp_path / "b.ptom").read_bytes()


@pytest.mark.pypto
@pytest.mark.parametrize("sabotage,timeout,expected", [
    ("import os\nos._exit(3)\n", "300", "crashed (exit code 3)"),
    # each hanging part waits out its limit: 2 s is long past the child's load (0.05 s)
    ("import time\ntime.sleep(120)\n", "2", "did not finish within 2 s"),
])
def test_a_kernel_that_crashes_or_hangs_falls_back_and_the_report_says_why(
        sabotage, timeout, expected, tmp_path, monkeypatch, capfd):
    from pypto_offline.pypto_kernels import codegen

    honest = codegen.kernel_source
    monkeypatch.setattr("pypto_offline.pypto_kernels.compiler.kernel_source",
                        lambda region, policy, constants: honest(region, policy, constants)
                        + sabotage)
    out = tmp_path / "example.ptom"
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *SHAPE, "-o", str(out), "--json",
                     "--no-tile-search", "--kernel-timeout", timeout,
                     "--cache-dir", str(tmp_path / "cache")]) == 0
    summary = json.loads(capfd.readouterr().out)
    assert summary["pypto"] == {**summary["pypto"], "compiled": 0}
    assert summary["verification"]["status"] == "passed"   # the unfused ops run instead
    assert summary["kernels_after"] == summary["kernels_before"]
    compiled = pypto_offline.load(out)
    # the region is cut, and its parts, until every part has failed so or is one op
    kernel, *parts = compiled.message.kernels
    assert kernel.HasField("cut") and parts and len(parts) == summary["pypto"]["fell_back"] - 1
    assert all(not k.compiled and expected in k.fallback_reason for k in (kernel, *parts))
    categories = {u.op_type: u.category for u in compiled.message.unfused}
    # the 3x3 convolution: its kernel would stage more through GM than fusing it saves
    assert categories.pop("Conv") == "does not pay"
    assert set(categories.values()) == {fallback_category(k) for k in (kernel, *parts)} \
        == {kernel.fallback_category}
    assert kernel.fallback_category in ("compile failed", "worker crashed", "timed out")
    report = Path(summary["report"]).read_text()
    assert "fell back" in report and expected in report


def test_jobs_and_timeout_must_be_positive(capfd):
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "--jobs", "0"]) == 2
    assert "must be positive" in capfd.readouterr().err
