"""Each malformed model gives one clear line naming the file or node, exit code 2, no traceback, and
nothing written."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pypto_offline import cli
from pypto_offline.errors import PyptoOfflineError
from pypto_offline.importer import import_model
from tests.malformed import CASES


def _files(folder):
    return sorted(p for p in folder.rglob("*"))


PROGRESS_LINE = re.compile(r"^\[ *\d+\.\d s\] [a-z]")


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_refuses_with_one_clear_line(case, tmp_path, capfd):
    build, extra, words = CASES[case]
    model = build(tmp_path)
    before = _files(tmp_path)
    code = cli.main([str(model), "--target", "kirin9050", *extra])
    out, err = capfd.readouterr()  # file descriptors: C libraries must stay quiet too
    assert code == 2
    assert out == ""
    *progress, line = err.strip().splitlines()
    assert all(PROGRESS_LINE.match(p) for p in progress), err  # stage lines, then one error
    lines = [line]
    assert lines[0].startswith("pypto-offline: error: ")
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], f"{word!r} missing from: {lines[0]}"
    assert _files(tmp_path) == before


@pytest.mark.parametrize("case", ["cycle", "reshape does not multiply out"])
def test_api_raises_the_same_error(case, tmp_path):
    build, extra, words = CASES[case]
    with pytest.raises(PyptoOfflineError) as caught:
        import_model(build(tmp_path))
    assert all(word in str(caught.value) for word in words)


def test_exit_code_from_a_real_process(tmp_path):
    model = CASES["truncated file"][0](tmp_path)
    done = subprocess.run([sys.executable, "-m", "pypto_offline", str(model), "--target",
                           "ascend910b"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr and "not a readable ONNX model" in done.stderr
