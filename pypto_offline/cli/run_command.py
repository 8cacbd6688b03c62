"""``pypto-offline run BLOB --inputs ...``: the blob alone executed on the host by the reference
runtime (``CompiledModel.execute``, docs/runtime.md), its outputs written as .npy files, its
host time and modelled device time reported (as trtexec's --loadEngine and ais_bench's loop).

Every check comes before the first run: the blob, the inputs (names, dtypes, a gear's shapes,
none missing unless --random-inputs), the output folder and files. The outputs are written
together once the runs are done (``blob.write_together``): an error or an interrupt leaves
nothing half-written, and an output folder made for the run is removed again if empty.
"""
from __future__ import annotations

import statistics
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from pypto_offline.errors import UsageError

MAX_LOOP = 10_000
# Progress of a --loop: a line for each of the first runs, then one every few seconds at most
PROGRESS_FIRST_RUNS, PROGRESS_EVERY_S = 3, 2.0
# An output file name longer than this (bytes) is cut and given a digest: file systems take 255
MAX_FILE_NAME_BYTES = 200


def run_parser(blob_parser):
    parser = blob_parser("pypto-offline run", (
        "Execute a blob on the host, the blob alone (no ONNX model needed): the gear its inputs' "
        "shapes pick, each output written as DIR/<output name>.npy; with --loop N, the host "
        "time of N runs and the blob's modelled device time (docs/runtime.md)."))
    parser.add_argument("--inputs", metavar="IN.npz|NAME=FILE.npy,...",
                        help="the inputs by name: an .npz, or comma-separated NAME=FILE.npy")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="where the outputs go (default: BLOB's stem + .outputs/, beside it; "
                             "created if missing)")
    parser.add_argument("--gear", type=int, metavar="N",
                        help="run gear N (0 the first), whose shapes the inputs must have "
                             "(default: the gear of the inputs' shapes)")
    parser.add_argument("--loop", type=int, default=1, metavar="N",
                        help=f"run N times (1 to {MAX_LOOP}): host time min/median/max")
    parser.add_argument("--random-inputs", action="store_true",
                        help="generate the inputs --inputs does not give (seeded; said on "
                             "stderr and in --json)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --random-inputs "
                                                            "(default 0)")
    return parser


@dataclass(frozen=True)
class Feeds:
    """What a run is given: every input's array, and which of them were generated."""

    arrays: dict[str, np.ndarray]
    generated: tuple[str, ...]


def run_blob(args) -> int:
    """The ``run`` command on parsed ``args`` (``run_parser``'s)."""
    from pypto_offline import api
    from pypto_offline.cli.builds import output_dir
    from pypto_offline.cli.text import print_summary, printable
    from pypto_offline.offline_compiler.device_time import modelled_time

    if not 1 <= args.loop <= MAX_LOOP:
        raise UsageError(f"--loop {args.loop} is out of range", fix=f"give 1 to {MAX_LOOP}")
    compiled = api.load(args.blob)
    given = _read_inputs(args.inputs)
    gear = _gear(compiled, given, args.gear, args.random_inputs)
    graph = onnx.load_from_string(_gear_graph(compiled, gear))
    feeds = _feeds(compiled, graph, given, args)
    folder = Path(args.output_dir) if args.output_dir else _default_folder(Path(args.blob))
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"the output folder {str(folder)!r} is a file",
                         fix="give --output-dir a folder (created if missing)")
    with output_dir(str(folder)):  # made for the run, removed again if nothing is written
        files = _output_files(folder, [o.name for o in graph.graph.output])
        _check_files(files, args)
        if feeds.generated and not args.quiet:
            print(f"pypto-offline: note: generated inputs {printable(', '.join(feeds.generated))}"
                  f" (--random-inputs, seed {args.seed})", file=sys.stderr)
        executions = _loop(compiled, feeds.arrays, gear, args)
        _write_outputs(files, executions[-1].outputs)
    summary = _summary(compiled, args, gear, feeds, files, executions,
                       modelled_time(compiled.message, gear).as_dict(), folder)
    print_summary(summary, args, human_run)
    return 0


def _read_inputs(spec: str | None) -> dict[str, np.ndarray]:
    if spec is None:
        return {}
    from pypto_offline.verify import read_inputs

    return read_inputs(spec)


def _gear(compiled, given: Mapping[str, np.ndarray], asked: int | None, generate: bool) -> int:
    """The gear the given inputs' shapes pick (``gears.pick``'s rule, over the inputs given:
    --random-inputs (``generate``) makes the others in that gear's shapes), or ``asked``, whose
    shapes they must have. Inputs several gears take, the others to be generated: --gear says
    which (without --random-inputs the missing ones are refused, by name, in ``_feeds``)."""
    from pypto_offline.offline_compiler import gears as gear_table

    shapes = gear_table.shapes_of(compiled.message)
    if asked is not None and not 0 <= asked < len(shapes):
        raise UsageError(f"--gear {asked}: the blob has {len(shapes)} gear(s)",
                         where=compiled.label, fix=f"give 0 to {len(shapes) - 1}")
    given_shapes = {name: tuple(np.shape(v)) for name, v in given.items()}
    indices = range(len(shapes)) if asked is None else [asked]
    fitting = [i for i in indices if all(given_shapes[name] == tuple(dims)
                                         for name, dims in shapes[i].items() if name in given)]
    if not fitting and asked is not None:
        raise UsageError(f"--gear {asked} takes inputs of shapes "
                         f"{gear_table.shapes_text(shapes[asked])}, not "
                         f"{gear_table.shapes_text(given_shapes)}", where=compiled.label,
                         fix="give that gear's shapes, or leave --gear out")
    if not fitting:  # the refusal that lists the gears (docs/gears.md)
        gear_table.pick(shapes, given_shapes)
    if len(fitting) > 1 and generate and not set(shapes[fitting[0]]) <= set(given):
        raise UsageError(f"gears {', '.join(map(str, fitting))} all take the given inputs",
                         where=compiled.label, fix="say which with --gear N")
    return fitting[0]


def _gear_graph(compiled, gear: int) -> bytes:
    from pypto_offline.offline_compiler import gears as gear_table

    return gear_table.gear_graph(compiled.message, gear)


def _feeds(compiled, graph: onnx.ModelProto, given: dict[str, np.ndarray], args) -> Feeds:
    """The given inputs checked against the gear's graph (names, dtypes exactly, shapes), and
    the missing ones refused, or generated with --random-inputs."""
    from pypto_offline.importer.input_shapes import check_given_inputs, graph_inputs
    from pypto_offline.runtime import generate_inputs

    check_given_inputs(graph, given, compiled.label)
    missing = tuple(v.name for v in graph_inputs(graph) if v.name not in given)
    if missing and not args.random_inputs:
        raise UsageError(f"--inputs gives no value for {', '.join(map(repr, missing))}",
                         where=compiled.label,
                         fix="give every input, or --random-inputs to generate the others")
    return Feeds(generate_inputs(graph, seed=args.seed, given=given) if missing else given,
                 missing)


def _default_folder(blob: Path) -> Path:
    """BLOB's stem + .outputs, beside it: model.kirin9050.ptom → model.kirin9050.outputs/."""
    return blob.with_name(f"{blob.stem}.outputs")


def output_file_name(name: str) -> str:
    """An output's file name, ``<name>.npy``, when the name is a safe file name; else the name
    percent-encoded (a slash, a leading dot, '..', control characters, '%': each as %XX, so two
    names never share a file) and, past ``MAX_FILE_NAME_BYTES``, cut with a digest."""
    import hashlib

    encoded = urllib.parse.quote(name, safe="-_+=@,")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    encoded = encoded or "%00"  # an empty name (ONNX allows it for no tensor) still has a file
    if len(encoded) > MAX_FILE_NAME_BYTES:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        encoded = f"{encoded[:MAX_FILE_NAME_BYTES - 17]}~{digest}"
    return encoded + ".npy"


def _output_files(folder: Path, names: list[str]) -> dict[str, Path]:
    return {name: folder / output_file_name(name) for name in names}


def _check_files(files: Mapping[str, Path], args) -> None:
    """No output may overwrite the blob or an input file, or be anything but a file to write."""
    from pypto_offline.offline_compiler.blob import check_outputs
    from pypto_offline.verify import input_files

    inputs = {"blob": Path(args.blob)}
    if args.inputs:
        inputs.update({f"--inputs file {path}": Path(path)
                       for path in input_files(args.inputs).values()})
    check_outputs({f"output {name!r}": path for name, path in files.items()}, inputs)


def _loop(compiled, feeds: Mapping[str, np.ndarray], gear: int, args) -> list:
    """``args.loop`` executions of the gear, in one pool of PyPTO workers (a kernel run by
    PyPTO needs a worker, whose start imports torch and PyPTO: once, not once a run); a
    progress line on stderr for each of the first runs and then every few seconds (none with
    --quiet or for one run)."""
    from pypto_offline import api

    with api.shared_workers(1):
        return _runs(compiled, feeds, gear, args)


def _runs(compiled, feeds: Mapping[str, np.ndarray], gear: int, args) -> list:
    executions, said = [], time.monotonic()
    for index in range(1, args.loop + 1):
        executions.append(compiled.execute(feeds, gear=gear))
        now = time.monotonic()
        if args.loop > 1 and not args.quiet and (index <= PROGRESS_FIRST_RUNS or index == args.loop
                                                 or now - said >= PROGRESS_EVERY_S):
            said = now
            print(f"pypto-offline: run {index}/{args.loop}: "
                  f"{executions[-1].seconds * 1e3:.3f} ms", file=sys.stderr, flush=True)
    return executions


def _write_outputs(files: Mapping[str, Path], outputs: Mapping[str, np.ndarray]) -> None:
    import io

    from pypto_offline.offline_compiler.blob import write_together

    data = {}
    for name, path in files.items():
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(outputs[name]), allow_pickle=False)
        data[path] = buffer.getvalue()
    write_together(data)


def _summary(compiled, args, gear: int, feeds: Feeds, files: Mapping[str, Path], executions,
             device: dict, folder: Path) -> dict:
    """The ``--json`` object (summary.schema.json, ``run``)."""
    from pypto_offline.offline_compiler import gears as gear_table
    from pypto_offline.offline_compiler.summary import SCHEMA_VERSION

    seconds = [e.seconds for e in executions]
    outputs = executions[-1].outputs
    return {
        "schema_version": SCHEMA_VERSION, "blob": args.blob,
        "model": compiled.message.provenance.model_name, "target": compiled.target,
        "gear": gear, "gear_inputs": {n: list(d) for n, d in
                                      gear_table.shapes_of(compiled.message)[gear].items()},
        "inputs": {"given": sorted(set(feeds.arrays) - set(feeds.generated)),
                   "generated": list(feeds.generated),
                   "seed": args.seed if feeds.generated else None},
        "output_dir": str(folder),
        "outputs": [{"name": name, "file": str(path), "dtype": str(outputs[name].dtype),
                     "shape": list(np.shape(outputs[name]))} for name, path in files.items()],
        "loop": args.loop,
        "host": {"seconds": [round(s, 6) for s in seconds], "min_ms": _ms(min(seconds)),
                 "median_ms": _ms(statistics.median(seconds)), "max_ms": _ms(max(seconds))},
        "device": device,
        "kernels": [{"id": k.id, "by": k.by, "why": k.why,
                     "seconds": None if k.seconds is None else round(k.seconds, 6)}
                    for k in executions[-1].kernels],
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def human_run(s: dict) -> str:
    """The run's summary for a terminal: the outputs, the host time, the modelled time."""
    device, host = s["device"], s["host"]
    by = {}
    for kernel in s["kernels"]:
        by[kernel["by"]] = by.get(kernel["by"], 0) + 1
    lines = [f"{s['blob']}: gear {s['gear']}, {len(s['outputs'])} output(s) in "
             f"{s['output_dir']}"]
    lines += [f"  {o['name']} -> {o['file']}  {o['dtype']} {o['shape']}" for o in s["outputs"]]
    if s["inputs"]["generated"]:
        lines.append(f"  generated inputs (seed {s['inputs']['seed']}): "
                     f"{', '.join(s['inputs']['generated'])}")
    lines.append(f"  host time, {s['loop']} run(s): min {host['min_ms']:.3f} ms, median "
                 f"{host['median_ms']:.3f} ms, max {host['max_ms']:.3f} ms")
    kernels_us = sum(k["total_us"] for k in device["kernels"])
    lines.append(f"  modelled device time on {s['target']}: {device['total_us']:.1f} µs, an "
                 f"estimate: {len(device['kernels'])} kernel(s) {kernels_us:.1f} µs (PyPTO's "
                 f"cost model, plus {device['launch_us']} µs a launch), {device['unfused_ops']} "
                 f"unfused op(s) {device['unfused_us']:.1f} µs (bandwidth model)")
    if by:
        lines.append("  kernels run by " + ", ".join(f"{how}: {n}" for how, n in by.items()))
    return "\n".join(lines)
