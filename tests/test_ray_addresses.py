"""Issue 34 rows 3 and 5: a Ray address where no cluster answers, or one that is not an address,
is the user's slip: exit 2 within seconds, naming the address and how to start a cluster (on
cb4dc9a: a hang past 10 minutes in Ray's retry loop, or exit 3). No cluster is started here: the
probes go to loopback ports nothing listens on (row 4, interrupts on a real cluster, is in
tests/test_ray_farm.py).

Issue 50 row 5: an address where something else answers (an HTTP server, Ray's dashboard, a
server that takes the connection and says nothing, a gRPC server that is not Ray's GCS) is
refused the same, within the probe's 5 s; on 1e2aec7 such a build hung in ``ray.init`` for 700+ s
and SIGINT took ~30 s. Each runs in a network namespace of its own, listener and build
(``tests/ray_listeners.py``): Ray's driver looks for the machine's external address."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_offline import cli
from tests.onnx_builders import one_node
from tests.ray_listeners import LIMIT_S

REPO = Path(__file__).resolve().parent.parent


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


def beside(kind: str, model: Path, cache: Path, *flags: str) -> dict:
    """tests/ray_listeners.py's report of a build given a listener of ``kind`` as its address,
    both in a network namespace of their own (only loopback, up)."""
    script = f'ip link set lo up && exec "{sys.executable}" -m tests.ray_listeners ' \
             f'{kind} "{model}" "{cache}" {" ".join(flags)}'
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True,
                          text=True, cwd=REPO, env=environment, timeout=2 * LIMIT_S + 30)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")] or [done.stderr[-2000:]]
    return json.loads(line)


@pytest.mark.parametrize("kind,expected", [
    ("http", "an HTTP server answered at 127.0.0.1:{port} ('<!DOCTYPE HTML>'), not a Ray "
             "cluster's GCS"),
    ("silent", "something at 127.0.0.1:{port} took the connection but said nothing within 5 s, "
               "not a Ray cluster's GCS"),
    ("grpc", "an HTTP/2 server answered at 127.0.0.1:{port}, not a Ray cluster's GCS (no answer "
             "to /ray.rpc.NodeInfoGcsService/GetClusterId)"),
    ("client", "a Ray Client server answered at 127.0.0.1:{port}, not a Ray cluster's GCS "
               "(give ray://127.0.0.1:{port})"),
])
def test_a_ray_address_where_something_else_answers_is_exit_2_within_seconds(kind, expected,
                                                                             model, tmp_path):
    report = beside(kind, model, tmp_path / "cache")
    err = report["stderr"]
    assert report["exit"] == 2, report
    assert expected.format(port=report["port"]) in err, err
    assert report["seconds"] < 10 and report["total"] < 30, report
    assert err.count("\n") == 1 and not (tmp_path / "cache").exists(), err


def test_sigint_while_an_address_is_probed_ends_the_build_at_once(model, tmp_path):
    report = beside("silent", model, tmp_path / "cache", "--interrupt")
    assert report["exit"] == 130 and report["seconds"] < 3, report
    assert report["stderr"] == "pypto-offline: interrupted\n", report
    assert not (tmp_path / "cache").exists()
