"""Issue 50 row 9 and its "Also": what a careless user runs into. A FIFO named as a file to read
(it hung), a Ctrl-C while the command still loads (a traceback), a refused batch's
--output-dir (left behind, empty), a message naming --input-shape to a user who typed ATC's
--input_shape, a --kernel-timeout of 0.5 said as "within 0 s", and the fast tier of make
(it opened Chromium, which only make test installs). None needs PyPTO."""
import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_offline import cli
from pypto_offline.pypto_kernels.jobs.protocol import timed_out
from tests.malformed import EXAMPLE

REPO = Path(__file__).resolve().parent.parent
SHAPE = ["--input-shape", "x=1,3,64,64"]
# Long enough for the command's imports on a loaded machine; a FIFO's open never returns.
HANG_S = 60


def _command(args: list[str], cwd: Path, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    """``python -m pypto_offline ARGS`` from the repository (its package, not another)."""
    try:
        return subprocess.run([sys.executable, "-m", "pypto_offline", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pypto-offline {' '.join(args)} still ran after {timeout} s (it waits on "
                    f"a FIFO's writer)")


# -- a FIFO (or a folder, a device) named as a file to read -------------------------------------

FIFO_READERS = {  # what names the FIFO → the command, and the words naming it in the refusal
    "the model": (lambda fifo, out: [fifo, "--target", "kirin9050"], "the model's path"),
    "--keep_dtype": (lambda fifo, out: [str(EXAMPLE), "--target", "kirin9050", *SHAPE,
                                        "--precision_mode", "force_fp16", "--keep_dtype", fifo,
                                        "--no-report", "--no-verify", "-o", out],
                     "--keep_dtype"),
    "--inputs": (lambda fifo, out: [str(EXAMPLE), "--target", "kirin9050", *SHAPE, "--inputs",
                                    fifo, "--no-report", "-o", out], "--inputs"),
    "inspect's blob": (lambda fifo, out: ["inspect", fifo], "the blob's path"),
    "verify's blob": (lambda fifo, out: ["verify", fifo], "the blob's path"),
    "report's blob": (lambda fifo, out: ["report", fifo, "-o", out + ".html"], "the blob's path"),
}


@pytest.mark.parametrize("reader", FIFO_READERS)
def test_a_fifo_named_as_a_file_to_read_is_refused_not_waited_on(tmp_path, reader):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    command, named = FIFO_READERS[reader]
    done = _command(command(str(fifo), str(tmp_path / "out.ptom")), tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"{fifo}: {named} names a pipe (FIFO), not a file to read" in done.stderr
    assert not (tmp_path / "out.ptom").exists()


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a device"), ("folder", "a folder")])
def test_a_keep_dtype_of_a_device_or_a_folder_is_refused_naming_it(tmp_path, capsys, path, kind):
    (tmp_path / "folder").mkdir()
    path = path if path.startswith("/") else str(tmp_path / path)
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *SHAPE, "--no-report",
                     "--precision_mode", "force_fp16", "--keep-dtype", path,
                     "-o", str(tmp_path / "out.ptom"), "--cache-dir", str(tmp_path / "c")]) == 2
    assert f"{path}: --keep_dtype names {kind}, not a file to read" in capsys.readouterr().err


# -- Ctrl-C while the command still loads -------------------------------------------------------

def _mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("launcher", ["python -m pypto_offline", "the console script"])
@pytest.mark.parametrize("library", ["_multiarray_umath", "onnx_cpp2py_export"])
def test_ctrl_c_while_the_command_loads_ends_it_with_one_line_and_130(launcher, library):
    """SIGINT once numpy's (then onnx's) compiled module is loaded: the command's imports are
    under way, outside the CLI's handling, as a user's early Ctrl-C finds them."""
    command = [sys.executable, "-m", "pypto_offline"] if launcher.startswith("python") else \
        [str(Path(sys.executable).with_name("pypto-offline"))]
    process = subprocess.Popen([*command, "targets"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_S
    while not _mapped(process.pid, library) and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, "the command ended before its imports were seen"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=HANG_S)
    assert (process.returncode, err) == (130, "pypto-offline: interrupted\n")


# -- --output-dir of a command that wrote nothing -----------------------------------------------

def _two_models(tmp_path: Path) -> list[str]:
    models = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for model in models:
        shutil.copy(EXAMPLE, model)
    return [str(model) for model in models]


def test_a_batch_with_an_unknown_chip_leaves_no_output_dir(tmp_path, capsys):
    made = tmp_path / "new" / "out"
    assert cli.main([*_two_models(tmp_path), "--target", "kirin9050,kirin0000", "--no-report",
                     "--output-dir", str(made), "--cache-dir", str(tmp_path / "c")]) == 2
    assert "unknown target 'kirin0000'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_batch_whose_every_build_failed_leaves_no_output_dir_but_keeps_one_that_was_there(
        tmp_path, capsys):
    models = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for model in models:
        model.write_bytes(b"not a model")
    kept = tmp_path / "kept"
    kept.mkdir()
    for folder in (tmp_path / "new", kept):
        assert cli.main([*map(str, models), "--target", "kirin9050", "--no-report",
                         "--output-dir", str(folder), "--cache-dir", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.count("not a readable ONNX model") == 4
    assert not (tmp_path / "new").exists() and kept.is_dir()


# -- messages name the option the user typed ---------------------------------------------------

SPELLINGS = [  # the shape options given → what the refusal says
    (["--input_shape", "x:1,3,32,32"], "--input_shape gives [1, 3, 32, 32], but the model"),
    (["--input-shape", "x=1,3,32,32"], "--input-shape gives [1, 3, 32, 32], but the model"),
    (["--input_shape", "x:1,3,64,64;x:1,3,64,64"], "error: --input_shape names 'x' twice"),
    (["--input_shape", "x:1,3,64,64", "--input-shape", "x=1,3,64,64"],
     "--input-shape and --input_shape both name 'x'"),
    (["--input-shape", "x=-1,3,64,64"], "--input-shape gives input 'x' a -1 dimension"),
    (["--input-shape", "x=-1,3,64,64", "--dynamic_dims", "1,2;3,4"],
     "has 2 value(s), and --input-shape 1 -1 dimension(s)"),
    (["--input_shape", "x:2,3,64,64", "--dim", "batch=1,2"],
     "--dim batch sizes only x, whose shape --input_shape gives (leave x out of --input_shape"),
]


@pytest.mark.parametrize("given, says", SPELLINGS, ids=[" ".join(s) for s, _ in SPELLINGS])
def test_a_shape_refusal_names_the_option_the_user_typed(tmp_path, capsys, given, says):
    assert cli.main([str(EXAMPLE), "--target", "kirin9050", *given, "--no-report",
                     "--no-verify", "-o", str(tmp_path / "out.ptom"),
                     "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert says in err.splitlines()[-1] and "Traceback" not in err


def test_a_batch_s_shape_for_no_model_names_the_option_the_user_typed(tmp_path, capsys):
    assert cli.main([*_two_models(tmp_path), "--target", "kirin9050", "--input_shape", "y:1",
                     "--no-report", "--output-dir", str(tmp_path / "out"),
                     "--cache-dir", str(tmp_path / "c")]) == 2
    assert "--input_shape names 'y', an input of none of the models" in \
        capsys.readouterr().err


# -- --kernel-timeout 0.5 -----------------------------------------------------------------------

@pytest.mark.parametrize("limit, says", [(0.5, "0.5 s"), (2.25, "2.25 s"), (300, "300 s"),
                                         (300.0, "300 s")])
def test_a_time_out_says_the_limit_as_given(limit, says):
    assert timed_out(limit).reason == f"PyPTO compile did not finish within {says}"


# -- make test-fast on a fresh clone ------------------------------------------------------------

def _recipe(target: str) -> tuple[str, str]:
    """A Makefile target's prerequisites and its recipe's lines, as written."""
    text = (REPO / "Makefile").read_text()
    found = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert found, target
    return found.group(1), found.group(2)


def _tests_that_open_a_page(path: Path) -> dict[str, ast.FunctionDef]:
    """The module's test functions that call ``browser.…`` (bench/browser.py), themselves or
    through a helper of the module."""
    functions = {node.name: node for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.FunctionDef)}

    def calls(function):
        for node in ast.walk(function):
            if isinstance(node, ast.Call):
                callee = node.func
                if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name):
                    yield f"{callee.value.id}.{callee.attr}"
                elif isinstance(callee, ast.Name):
                    yield callee.id

    opening = {name for name, function in functions.items()
               if any(call.startswith("browser.") for call in calls(function))}
    while True:
        more = {name for name, function in functions.items() if set(calls(function)) & opening}
        if more <= opening:
            break
        opening |= more
    return {name: functions[name] for name in opening if name.startswith("test_")}


def _marked(function: ast.FunctionDef, marker: str) -> bool:
    return any(isinstance(decorator, ast.Attribute) and decorator.attr == marker
               for decorator in function.decorator_list)


def test_the_fast_tier_leaves_out_every_test_that_opens_a_browser_which_it_does_not_install():
    needs, recipe = _recipe("test-fast")
    assert "chromium" not in needs and "-m \"not pypto and not browser\"" in recipe
    assert "chromium" in _recipe("test")[0]
    opening = {f"{path.name}::{name}": function for path in sorted((REPO / "tests").glob("*.py"))
               for name, function in _tests_that_open_a_page(path).items()}
    assert "test_report.py::test_report_in_headless_chromium_matches_the_json_summary" in opening
    unmarked = [name for name, function in opening.items() if not _marked(function, "browser")]
    assert unmarked == []
