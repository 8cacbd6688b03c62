"""The rules of the house that code can check (docs/architecture.md): no module of the package
over 600 lines, and no module, test or bench that reaches another module's private name (a
leading underscore): what a test needs is public, or given to the code (an executor, a setup)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pypto_offline"
MAX_MODULE_LINES = 600
GENERATED = {"ptom_pb2.py"}  # protoc's output


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if p.name not in GENERATED)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str | None) -> bool:
    return bool(module) and (module == "pypto_offline" or module.startswith("pypto_offline."))


def private_uses(path: Path) -> list[str]:
    """Where ``path`` names a private name of a module of ours other than itself: imported
    (``from pypto_offline.x import _y``), read from a module it imported (``x._y``), or given
    to ``monkeypatch.setattr`` as a dotted string."""
    tree = ast.parse(path.read_text(), str(path))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _ours(node.module):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
                else:
                    modules.add(alias.asname or alias.name)  # may be a module of ours
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if _ours(a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and \
                isinstance(node.value, ast.Name) and node.value.id in modules:
            found.append(f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("pypto_offline.") and " " not in node.value and \
                any(_private(part) for part in node.value.split(".")):
            found.append(f"{path.name}:{node.lineno} names {node.value}")
    return found


def test_no_module_of_the_package_is_over_600_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules(PACKAGE)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these modules: {long}"


@pytest.mark.parametrize("folder", ["pypto_offline", "tests", "bench"])
def test_nothing_reaches_a_private_name_of_another_module(folder):
    found = [use for path in _modules(REPO / folder) for use in private_uses(path)]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_private_name(tmp_path):
    """The rule's own check, on a file that breaks it three ways (the names are made up: the
    check reads names, it does not import them)."""
    sample = tmp_path / "sample.py"
    sample.write_text("from pypto_offline.somewhere import module\n"
                      "from pypto_offline.somewhere.module import _hidden\n"
                      "module._hidden\n"
                      "patch('pypto_offline.somewhere.module._hidden')\n")
    assert len(private_uses(sample)) == 3


def test_the_worker_imports_the_job_protocol_and_nothing_else_of_the_compiler():
    """The fork server's module, at its top: its helpers of its own and the protocol, never the
    compiler's modules (they would be imported for a few names; a check imports the one
    comparison, ``runtime.max_abs_diff``, where it runs)."""
    tree = ast.parse((PACKAGE / "pypto_kernels" / "worker.py").read_text())
    ours = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and _ours(node.module):
            ours |= {f"{node.module}.{a.name}" if node.module == "pypto_offline.pypto_kernels"
                     else node.module for a in node.names}
    assert ours == {
        "pypto_offline.pypto_kernels.jobs.protocol", "pypto_offline.pypto_kernels.program_figures",
        "pypto_offline.pypto_kernels.host_compiler_cache",
        "pypto_offline.pypto_kernels.worker_setup"}
    # and its environment's set-up (split out of it) imports the protocol only
    setup = ast.parse((PACKAGE / "pypto_kernels" / "worker_setup.py").read_text())
    assert {node.module for node in setup.body if isinstance(node, ast.ImportFrom)
            and _ours(node.module)} == {"pypto_offline.pypto_kernels.jobs.protocol"}
