"""Issue 34 rows 3 and 5: a Ray address where no cluster answers, or one that is not an address,
is the user's slip: exit 2 within seconds, naming the address and how to start a cluster (on
cb4dc9a: a hang past 10 minutes in Ray's retry loop, or exit 3). No cluster is started here: the
probes go to loopback ports nothing listens on (row 4, interrupts on a real cluster, is in
tests/test_ray_farm.py)."""
from __future__ import annotations

import socket
import time

import pytest

from pypto_offline import cli
from tests.onnx_builders import one_node


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(one_node("Relu", [2, 3], opset=17).SerializeToString())
    return path


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:{port}", "no Ray cluster answers at 127.0.0.1:{port}"),
    ("ray://127.0.0.1:{port}", "no Ray cluster answers at 127.0.0.1:{port}"),
    ("127.0.0.1:99999", "is not HOST:PORT"),
    ("127.0.0.1", "is not HOST:PORT"),
    (":6379", "is not HOST:PORT"),
])
def test_a_ray_address_without_a_cluster_is_exit_2_within_seconds(address, expected, model,
                                                                   tmp_path, capfd):
    port = free_port()
    started = time.monotonic()
    code = cli.main([str(model), "--target", "kirin9050", "--executor", "ray",
                     "--ray-address", address.format(port=port), "--cache-dir",
                     str(tmp_path / "cache")])
    err = capfd.readouterr().err
    assert code == 2, err
    assert time.monotonic() - started < 30
    assert expected.format(port=port) in err and "ray start --head" in err, err
    assert "Traceback" not in err and not (tmp_path / "cache").exists()


def test_ray_address_from_the_environment_is_checked_the_same(model, monkeypatch, capfd):
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    assert cli.main([str(model), "--target", "kirin9050", "--executor", "ray"]) == 2
    assert "RAY_ADDRESS='127.0.0.1:" in capfd.readouterr().err


def test_auto_with_no_cluster_is_exit_2(model, monkeypatch, tmp_path, capfd):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))  # no address file of another test
    assert cli.main([str(model), "--target", "kirin9050", "--executor", "ray",
                     "--ray-address", "auto"]) == 2
    err = capfd.readouterr().err
    assert "--ray-address 'auto': Ray cannot connect (ConnectionError" in err, err
