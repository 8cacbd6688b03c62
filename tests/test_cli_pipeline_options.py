"""The build's options as a pipeline uses them (issue 20): ATC's spellings (--soc_version and the
chip names users type, --input_shape, --output as a stem), --dim for symbolic dimensions, a
--input-shape that contradicts the model refused, --fail-on-fallback, and a kernel cache one can
inspect and clean (PYPTO_OFFLINE_CACHE, `cache info`, `cache clean`) while builds use it.

One real PyPTO compile (the bundled example, no tile search) is shared by the module; the other
builds hit its cache or compile no kernel."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

import pypto_offline
from pypto_offline import api, cli, import_model
from pypto_offline.errors import UsageError
from pypto_offline.targets import TARGETS, known_names, resolve_target
from tests.malformed import EXAMPLE
from tests.onnx_builders import GraphBuilder

KIRIN = ["--target", "kirin9050"]


# --- chip names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,target", [
    ("Kirin9030", "kirin9030"), ("kirin9030", "kirin9030"), ("Kirin9050", "kirin9050"),
    ("KirinDev0000", "kirin9050"), ("KirinX90", "kirin90"), ("Kirin90", "kirin90"),
    ("KIRINX90", "kirin90"), ("Ascend910B", "ascend910b"), ("Ascend910B1", "ascend910b"),
    ("Ascend910B2", "ascend910b"), ("ascend910b3", "ascend910b"), ("Ascend910B4", "ascend910b"),
    ("Ascend950PR", "ascend950"), ("Ascend950DT", "ascend950"), ("Ascend950PR_9589", "ascend950"),
    ("ascend950", "ascend950"),
])
def test_a_chip_name_resolves_to_the_target_that_models_it(name, target):
    assert resolve_target(name).name == target
    assert api.get_target(name) is TARGETS[target]


def test_every_target_answers_to_its_own_name_and_soc_version():
    for name, target in TARGETS.items():
        assert resolve_target(name.upper()) is target
        assert resolve_target(target.soc_version.value) is target


def test_an_unknown_chip_name_is_one_line_listing_the_known_ones(capfd):
    assert cli.main([str(EXAMPLE), "--soc_version", "Ascend310P3"]) == 2
    (line,) = capfd.readouterr().err.splitlines()
    assert "unknown target 'Ascend310P3'" in line
    assert all(name in line for name in known_names())


def test_targets_lists_each_targets_chip_names(capfd):
    assert cli.main(["targets", "--json"]) == 0
    listing = json.loads(capfd.readouterr().out)
    assert listing["kirin9050"]["chip_names"] == ["KirinDev0000", "Kirin9050"]
    assert "Ascend950DT" in listing["ascend950"]["chip_names"]
    assert cli.main(["targets"]) == 0
    assert "Ascend910B3" in capfd.readouterr().out
