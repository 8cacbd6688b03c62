"""Behaviour unchanged, proved by data: what a refactor of the kernel stage must leave alone.

``record`` builds the bundled example and five corpus models of different kinds (a CNN, a
detector, two transformers, magika) cold, on a cache of its own, and keeps:
- every job a build hands to the PyPTO workers, as its ``job.json`` would be written (the job's
  own folder and the kernel cache's path replaced by placeholders: they are random staging
  names), with every candidate tile's generated kernel source inside it;
- every kernel's ``fallback_reason`` and ``fallback_category``, the PyPTO compiles and cache hits;
- the sha256 of each blob and report.
``warm`` rebuilds every case on a cache that ``record`` filled (e.g. by the code before the
change): every blob and report byte-identical, no PyPTO compile.
``compare`` tells two records apart (exit 1 on any difference).

    python -m bench.behaviour record /tmp/behaviour/before
    python -m bench.behaviour record /tmp/behaviour/after
    python -m bench.behaviour warm /tmp/behaviour/before --out /tmp/behaviour/warm
    python -m bench.behaviour compare /tmp/behaviour/before /tmp/behaviour/after /tmp/behaviour/warm

The record of the jobs (``jobs.json``: per build the sorted digests of its job texts; the texts
in ``jobs/``) is what a job protocol must keep byte for byte. Results: bench/results/behaviour/.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from pathlib import Path

import pypto_offline
from bench.corpus import MODELS, model_path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "example.onnx"
# (label, model name or "example", target, options): the example on three cost tables (910B for
# kirin, A5 for ascend950) and with the measured baseline (single-op jobs); the corpus for the
# target of the README's first command.
CASES = (
    ("example-kirin9050", "example", "kirin9050", {}),
    ("example-ascend950", "example", "ascend950", {}),
    ("example-baseline", "example", "kirin9050", {"measure_baseline": True}),
    ("cnn-ppocr_cls_v2", "ppocr_cls_v2", "kirin9050", {}),
    ("detector-nudenet", "nudenet_yolov8n_320", "kirin9050", {}),
    ("transformer-bert", "tf_bert_encoder", "kirin9050", {}),
    ("transformer-gpt2", "tf_gpt2_decoder_kv", "kirin9050", {}),
    ("magika", "magika_v3_3", "kirin9050", {}),
    # regions that fall back, and matmuls re-planned without their epilogue
    ("recogniser-ppocrv4_rec", "ppocrv4_rec", "kirin9050", {}),
)
FOLDER, CACHE = "<JOB FOLDER>", "<KERNEL CACHE>"


def _model(name: str):
    """The model's path and its input shapes as the corpus tests give them."""
    if name == "example":
        return EXAMPLE, {"x": [1, 3, 64, 64]}
    model = MODELS[name]
    return model_path(name), model.input_shapes


class JobLog:
    """The job texts of the builds, by build label, placeholders for the paths."""

    def __init__(self):
        self.lock, self.label, self.texts = threading.Lock(), None, {}

    def add(self, text: str, folder: str, cache: str | None) -> None:
        text = text.replace(json.dumps(folder)[1:-1], FOLDER)
        if cache:
            text = text.replace(json.dumps(cache)[1:-1], CACHE)
        with self.lock:
            self.texts.setdefault(self.label, []).append(text)


class RecordingExecutor:
    """The local executor, each job's ``job.json`` kept as the worker read it."""

    slots = None

    def __init__(self, log: JobLog):
        from pypto_offline.pypto_kernels.jobs.executor import LocalExecutor

        self._local, self._log = LocalExecutor(), log

    def run(self, folder: Path, job, target, timeout: float):
        from pypto_offline.pypto_kernels.cache import cache_root_of
        from pypto_offline.pypto_kernels.jobs.protocol import JOB_FILE

        try:
            return self._local.run(folder, job, target, timeout)
        finally:
            cache = cache_root_of(folder)
            self._log.add((folder / JOB_FILE).read_text(), str(folder), cache and str(cache))


def _build(label, name, target, options, cache: Path, out: Path, executor) -> dict:
    path, shapes = _model(name)
    compiled = pypto_offline.compile(path, target, shapes, cache_dir=cache, executor=executor,
                                     **options)
    blob, report = out / f"{label}.ptom", out / f"{label}.report.html"
    compiled.save(blob, report=report)
    summary = compiled.summary()
    return {"blob": _sha(blob), "report": _sha(report), "kernel_cache": compiled.kernel_cache,
            "kernels": [{k: kernel.get(k) for k in ("id", "status", "fallback_category",
                                                    "fallback_reason")}
                        for kernel in summary["kernels"]]}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(folder: Path, cache: Path | None, jobs_too: bool, only: str = "") -> dict:
    """The cases whose label starts with ``only`` (all by default), built on ``cache``."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = cache or folder / "cache"
    log = JobLog()
    executor = RecordingExecutor(log) if jobs_too else None
    builds = {}
    for label, name, target, options in CASES:
        if not label.startswith(only):
            continue
        log.label = label
        builds[label] = _build(label, name, target, options, cache, folder, executor)
        print(label, builds[label]["kernel_cache"], file=sys.stderr)
    (folder / "builds.json").write_text(json.dumps(builds, indent=1, sort_keys=True))
    if jobs_too:
        (folder / "jobs").mkdir(exist_ok=True)
        digests = {}
        for label, texts in log.texts.items():
            digests[label] = sorted(hashlib.sha256(t.encode()).hexdigest() for t in texts)
            for text in texts:
                digest = hashlib.sha256(text.encode()).hexdigest()
                (folder / "jobs" / f"{digest}.json").write_text(text)
        (folder / "jobs.json").write_text(json.dumps(digests, indent=1, sort_keys=True))
    return builds


def compare(first: Path, others: list[Path]) -> list[str]:
    """Every difference between the first record and the others: blobs, reports, fallbacks,
    kernel cache counts (a warm record must show no compile), jobs where both have them."""
    differences = []
    base = json.loads((first / "builds.json").read_text())
    for other in others:
        builds = json.loads((other / "builds.json").read_text())
        warm = not (other / "jobs.json").exists()
        for label, build in base.items():
            theirs = builds.get(label)
            if theirs is None:
                differences.append(f"{other}: {label} missing")
                continue
            if build["kernels"] != theirs["kernels"]:
                differences.append(f"{other}: {label}: kernels differ")
            if (build["blob"], build["report"]) != (theirs["blob"], theirs["report"]):
                differences += _outputs_differ(first / label, other / label)
            counts = theirs["kernel_cache"]
            if warm and counts["pypto_compiles"]:
                differences.append(f"{other}: {label}: {counts['pypto_compiles']} PyPTO "
                                   f"compiles on a warm cache")
            if not warm and counts != build["kernel_cache"]:
                differences.append(f"{other}: {label}: kernel cache {counts} against "
                                   f"{build['kernel_cache']}")
        if not warm and (first / "jobs.json").exists():
            ours = json.loads((first / "jobs.json").read_text())
            theirs = json.loads((other / "jobs.json").read_text())
            for label in ours:
                if ours[label] != theirs.get(label):
                    extra = set(theirs.get(label, [])) ^ set(ours[label])
                    differences.append(f"{other}: {label}: jobs differ ({len(extra)} job texts "
                                       f"in one record only)")
    return differences


def _outputs_differ(ours: Path, theirs: Path) -> list[str]:
    """Why the blob and report at ``theirs`` (a stem) differ from ``ours``, if they do once the
    one field this refactor added is left out: a fallback's recorded category (blob
    ``Kernel.fallback_category``, and with it the kernel's sha256, which the report shows)."""
    from pypto_offline.offline_compiler import blob

    mine = (ours.with_suffix(".ptom").read_bytes(), ours.with_suffix(".report.html").read_text())
    message = blob.from_bytes(theirs.with_suffix(".ptom").read_bytes())
    report = theirs.with_suffix(".report.html").read_text()
    categories = 0
    for kernel in message.kernels:
        if kernel.fallback_category:
            categories += 1
            recorded = kernel.sha256
            kernel.fallback_category = ""
            kernel.sha256 = ""
            kernel.sha256 = hashlib.sha256(kernel.SerializeToString(deterministic=True)
                                           ).hexdigest()
            report = report.replace(recorded, kernel.sha256)
    found = []
    if blob.to_bytes(message) != mine[0]:
        found.append(f"{theirs}: the blob differs")
    if report != mine[1]:
        found.append(f"{theirs}: the report differs")
    if categories and not found:
        print(f"{theirs.name}: identical but for {categories} recorded fallback categories")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.behaviour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="cold builds, jobs recorded")
    rec.add_argument("folder", type=Path)
    rec.add_argument("--only", default="", metavar="PREFIX", help="the cases of this label prefix")
    warm = sub.add_parser("warm", help="rebuild on the cache of an earlier record")
    warm.add_argument("record", type=Path)
    warm.add_argument("--out", type=Path, required=True)
    warm.add_argument("--only", default="", metavar="PREFIX", help="the cases of this label prefix")
    cmp_ = sub.add_parser("compare", help="the first record against the others")
    cmp_.add_argument("records", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.folder, None, jobs_too=True, only=args.only)
    elif args.command == "warm":
        record(args.out, args.record / "cache", jobs_too=False, only=args.only)
    else:
        differences = compare(args.records[0], args.records[1:])
        print("\n".join(differences) or "no difference")
        return 1 if differences else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
