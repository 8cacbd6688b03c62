"""Hypothesis explores new random examples on every developer run; in CI (CI=true) it replays a
fixed sequence, so that a submission's CI result does not depend on the draw.

The fast tier (``make test-fast``: ``-m "not pypto and not browser"``) runs with PyPTO hidden,
in this process and in every worker it starts: a test that needs PyPTO but lacks the ``pypto``
marker fails there instead of quietly making the tier slow. Chromium is hidden too (the tier
runs where none is installed): a test that opens a page fails there until it is marked
``browser``.

``example_cache``: the example's kernel compiled once for the run, for tests that only need it
built."""
import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

HIDDEN_PYPTO = Path(__file__).resolve().parent / "data" / "no_pypto"


def pytest_configure(config):
    expression = " ".join(config.option.markexpr.split())
    if "not pypto" in expression:
        _hide_pypto()
    if "not browser" in expression:
        from bench import browser

        browser.HIDDEN = ("the tests without the browser marker open no browser (make test-fast "
                          "runs where none is installed): mark this test @pytest.mark.browser")


def _hide_pypto() -> None:
    """The stand-in ``pypto`` (tests/data/no_pypto) first on the path of this process and of
    every process it starts (workers inherit the environment). Its ``lib/configs`` is the
    installed PyPTO's: a build reads the platform files there (pypto_kernels/platform.py)
    without importing PyPTO, which is what the stand-in refuses."""
    stand_in = Path(tempfile.mkdtemp(prefix="no_pypto-"))
    atexit.register(shutil.rmtree, stand_in, True)
    installed = importlib.util.find_spec("pypto")
    shutil.copytree(HIDDEN_PYPTO / "pypto", stand_in / "pypto")
    if installed is not None and installed.submodule_search_locations:
        (stand_in / "pypto" / "lib").mkdir()
        os.symlink(Path(list(installed.submodule_search_locations)[0]) / "lib" / "configs",
                   stand_in / "pypto" / "lib" / "configs")
    sys.path.insert(0, str(stand_in))
    sys.modules.pop("pypto", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(stand_in)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture(scope="session")
def example_cache(tmp_path_factory) -> Path:
    """A kernel cache holding the bundled example's kernel for kirin9050 (its default build,
    tile search included), compiled once for the run. Tests that need the example built, not
    compiled cold, start from a copy (``tests.cache_entries.warm_cache``); the cold compile, its
    determinism and its cache's trust are tested where they are the point."""
    from pypto_offline import cli
    from tests.malformed import EXAMPLE

    folder = tmp_path_factory.mktemp("example-cache")
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", "--input-shape", "x=1,3,64,64",
                     "-o", str(folder / "example.ptom"), "--no-report", "--quiet",
                     "--cache-dir", str(folder / "cache")]) == 0
    return folder / "cache"



@pytest.fixture(scope="session")
def int8_cache(tmp_path_factory) -> Path:
    """One kernel cache for the run's builds of the QDQ unit models (tests/qdq_models.py): a
    model built by two tests is compiled once."""
    return tmp_path_factory.mktemp("int8-cache")
