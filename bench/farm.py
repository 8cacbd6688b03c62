"""The compile farm against one machine (issue 20): the corpus models for two targets, cold,
built three ways: one batch here (one worker pool, one kernel cache), one batch on a local
two-node Ray cluster (``--executor ray``), and one process a build (what a pipeline calling the
tool per model does), each from an empty cache. Prints and keeps wall times, PyPTO compiles and
cache hits, and whether every blob is the same bytes in the three.

    python -m bench.farm [--models a,b] [--targets kirin9050,ascend910b] [--modes m,n] [--out DIR]

The Ray cluster and its driver run in a network namespace of their own (``unshare -n``,
loopback up; needs root): on the host network Ray binds the machine's external interface. On
one 2-core machine the cluster's two nodes share the same cores, so the farm shows its overhead
here, not a speed-up; its point is the same blobs from compiles spread over machines.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import corpus

RAY_PORT = 6398
MODES = ("batch_local", "batch_ray", "separate")
RAY = Path(sys.executable).with_name("ray")


def build_batch(models: list[str], targets: list[str], out: Path, cache: Path, executor: str,
                address: str | None) -> list[dict]:
    """Every model for every target in this process: one executor, one pool, one cache."""
    from pypto_offline import api

    rows = []
    with api.executor(executor, address) as where:
        jobs = where.slots or 2
        with api.shared_workers(jobs):
            for name in models:
                for target in targets:
                    rows.append(_build(name, target, out, cache, jobs, where))
    return rows


def _build(name: str, target: str, out: Path, cache: Path, jobs: int, executor) -> dict:
    from pypto_offline import api

    started = time.perf_counter()
    compiled = api.compile(corpus.model_path(name), target, corpus.MODELS[name].input_shapes,
                           cache_dir=cache, jobs=jobs, executor=executor)
    blob = compiled.save(out / f"{name}.{target}.ptom")
    return {"model": name, "target": target, "seconds": round(time.perf_counter() - started, 1),
            "sha256": hashlib.sha256(blob.read_bytes()).hexdigest(),
            "fell_back": compiled.summary()["pypto"]["fell_back"], **compiled.kernel_cache}


def _child(args: list[str], *, namespace: bool = False) -> list[dict]:
    """``python -m bench.farm --child ARGS`` (in a network namespace of its own with a Ray
    cluster for ``namespace``): the rows it prints."""
    command = [sys.executable, "-m", "bench.farm", "--child", *args]
    if namespace:
        script = (f"set -eu; ip link set lo up; export RAY_USAGE_STATS_ENABLED=0; "
                  f"trap '\"{RAY}\" stop --force >/dev/null 2>&1 || true' EXIT; "
                  f"\"{RAY}\" start --head --port {RAY_PORT} --num-cpus 2 --node-ip-address "
                  f"127.0.0.1 --include-dashboard=false --disable-usage-stats >/dev/null; "
                  f"\"{RAY}\" start --address 127.0.0.1:{RAY_PORT} --num-cpus 2 "
                  f"--node-ip-address 127.0.0.1 --disable-usage-stats >/dev/null; "
                  + " ".join(f"'{part}'" for part in command))
        command = ["unshare", "-n", "bash", "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def run_mode(mode: str, models: list[str], targets: list[str], folder: Path) -> dict:
    out, cache = folder / mode / "out", folder / mode / "cache"
    out.mkdir(parents=True)
    common = ["--targets", ",".join(targets), "--out", str(out), "--cache", str(cache)]
    started = time.perf_counter()
    if mode == "separate":
        rows = [row for name in models for target in targets
                for row in _child(["--models", name, "--targets", target, "--out", str(out),
                                   "--cache", str(cache), "--executor", "local"])]
    elif mode == "batch_ray":
        rows = _child(["--models", ",".join(models), *common, "--executor", "ray",
                       "--address", f"127.0.0.1:{RAY_PORT}"], namespace=True)
    else:
        rows = _child(["--models", ",".join(models), *common, "--executor", "local"])
    return {"mode": mode, "wall_s": round(time.perf_counter() - started, 1), "builds": rows,
            "pypto_compiles": sum(r["pypto_compiles"] for r in rows),
            "cache_hits": sum(r["hits"] for r in rows),
            "fell_back": sum(r["fell_back"] for r in rows)}


def table(results: list[dict], identical: bool) -> str:
    lines = ["| mode | wall s | PyPTO compiles | cache hits (kernels) | regions fell back |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['wall_s']} | {r['pypto_compiles']} | {r['cache_hits']} | "
              f"{r['fell_back']} |" for r in results]
    lines.append(f"\nblobs identical across the {len(results)} modes: "
                 f"{'yes' if identical else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(corpus.MODELS))
    parser.add_argument("--targets", default="kirin9050,ascend910b")
    parser.add_argument("--out", type=Path, default=Path("bench/results/farm"))
    parser.add_argument("--modes", default=",".join(MODES),
                        help="which of the three ways to build, in this order")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--executor", default="local", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    models, targets = args.models.split(","), args.targets.split(",")
    if args.child:
        for row in build_batch(models, targets, args.out, args.cache, args.executor,
                               args.address):
            print(json.dumps(row), flush=True)
        return 0
    results: list[dict] = []
    identical = False
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as scratch:
        for mode in args.modes.split(","):
            results.append(run_mode(mode, models, targets, Path(scratch)))
            print(f"{mode}: {results[-1]['wall_s']} s", file=sys.stderr, flush=True)
            # Kept after every mode: a run of hours that is stopped still leaves what it measured.
            identical = record(args.out, models, targets, results)
    print(table(results, identical))
    return 0 if identical else 1


def record(out: Path, models: list[str], targets: list[str], results: list[dict]) -> bool:
    """Write farm.json and farm.md for the modes run so far; whether their blobs agree."""
    digests = [{(b["model"], b["target"]): b["sha256"] for b in r["builds"]} for r in results]
    identical = all(d == digests[0] for d in digests) and len(digests[0]) == \
        len(models) * len(targets)
    out.mkdir(parents=True, exist_ok=True)
    (out / "farm.json").write_text(json.dumps(
        {"models": models, "targets": targets, "identical": identical, "results": results},
        indent=1))
    (out / "farm.md").write_text(table(results, identical) + "\n")
    return identical


if __name__ == "__main__":
    sys.exit(main())
