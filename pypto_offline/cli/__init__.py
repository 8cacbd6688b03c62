"""``pypto-offline``: a thin shell over the Python API. Parsing and printing only.

    pypto-offline MODEL.onnx --target T [options]     compile; writes MODEL.T.ptom and
                                                      MODEL.T.report.html
    pypto-offline targets [--json]                    the chips and their figures
    pypto-offline op NAME [--json]                    what the compiler does with an op
    pypto-offline inspect BLOB [--json]               what a blob holds
    pypto-offline verify BLOB [--onnx MODEL] [--json] check a blob again: its kernel sources derived
                                                      again, the onnxruntime check re-run
    pypto-offline run BLOB --inputs IN.npz [--loop N] run the blob on the host: outputs as .npy,
                                                      host and modelled device time
    pypto-offline report BLOB [-o PATH]               the HTML fusion report, from the blob alone
    pypto-offline cache info|clean [options]          the kernel cache: its size; removing entries

Exit codes: 0 success, 1 verification failed (or, with --fail-on-fallback, a region fell back),
2 bad input, usage or an unusable environment (one message, no traceback), 3 an internal error,
130 interrupted by SIGINT (Ctrl-C) and 143 by SIGTERM (128 + the signal: the build's PyPTO
workers are killed and nothing is written). See README.md.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from pypto_offline import __version__
from pypto_offline.cli.atc import add_atc_options, check_atc_options
from pypto_offline.cli.builds import (Build, builds_of, gear_request, output_dir,
                                      report_path)
from pypto_offline.cli.flags import add_option_flags, option_keywords
from pypto_offline.cli.text import (human_cache_clean, human_cache_info, human_summary,
                                    inspect_gear_text, kernel_lines, print_fallbacks,
                                    print_summary, printable, progress_on_stderr)
from pypto_offline.entry import interrupted
from pypto_offline.errors import PyptoOfflineError, UsageError
from pypto_offline.targets import TARGETS, chip_names

# 1 is also a build's exit code under --fail-on-fallback when a region fell back.
EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
SUBCOMMANDS = ("targets", "op", "inspect", "verify", "run", "report", "cache")


class _Parser(argparse.ArgumentParser):
    """Usage errors as our one-line error (argparse would print usage and exit itself), and no
    empty value: ``-o ""`` or ``--cache-dir ""`` (an unset shell variable, usually) would
    otherwise mean the default silently, and ``--ray-address ""`` a new local Ray instance."""

    def error(self, message: str):
        raise UsageError(message, fix=f"see '{self.prog} --help'")

    def __init__(self, *args, **kwargs):
        self.flags: dict[str, str] = {}  # an argument's dest → how the user spells it
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **options):
        action = super().add_argument(*names, **options)
        self.flags[action.dest] = "/".join(action.option_strings) or action.metavar or action.dest
        return action

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        for dest, value in vars(parsed).items():
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values):
                flag = self.flags.get(dest) or "--" + dest.replace("_", "-")
                raise UsageError(f"{flag} is given an empty value",
                                 fix="give it a value, or leave the option out for its default")
        return parsed


def compile_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pypto-offline", description=(
        "Compile an ONNX model for a Huawei NPU: fuse memory-bound ops into PyPTO kernels, pack "
        "them into one blob, and check the result against onnxruntime. Other commands: "
        + ", ".join(SUBCOMMANDS) + "."))
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help="path of an .onnx model (several: a batch build, one worker pool "
                             "and one kernel cache for all)")
    add_atc_options(parser)  # --model=FILE, --framework 5, --input_format
    parser.add_argument("--target", "--soc_version", dest="target", required=True,
                        metavar="CHIP[,CHIP...]",
                        help=f"chips, comma-separated: {', '.join(TARGETS)}, or their names as "
                             f"ATC's --soc_version writes them (Kirin9050, KirinX90, Ascend910B3, "
                             f"Ascend950PR, ...), in any case")
    parser.add_argument("-o", "--output",
                        help="blob path, one build only; without .ptom a stem, as ATC's "
                             "--output: out/model writes out/model.ptom (default: "
                             "MODEL.TARGET.ptom next to the model)")
    parser.add_argument("--report", metavar="PATH", help="HTML report path, one build only "
                                                         "(default: the blob's, .report.html)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="write every build's DIR/MODEL.TARGET.ptom and .report.html "
                             "(created if missing)")
    parser.add_argument("--no-report", action="store_true", help="write no HTML report")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                        help="fix the shape of a model input (repeatable)")
    parser.add_argument("--input_shape", dest="atc_input_shape", action="append", default=[],
                        metavar='"NAME:D0,D1,...;NAME:..."',
                        help="ATC's spelling: the shapes of several inputs, ';'-separated "
                             "(with --input-shape too, each input once)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=V[,V...]",
                        help="fix a symbolic dimension by its name in every input that has it, "
                             "e.g. --dim batch=1 --dim seq=128 (repeatable; --input-shape wins "
                             "for the inputs it names); several values are gears, one blob for "
                             "them all: --dim past=16,32,64. Several --dim with values: the "
                             "gears are their i-th values together (as ATC's --dynamic_dims), "
                             "every combination with --gear-product (docs/gears.md)")
    parser.add_argument("--gear-product", action="store_true",
                        help="the gears are every combination of the --dim values")
    from pypto_offline.importer.gears import MAX_GEARS

    for option, example in (("dynamic_batch_size", '"1,2,4"'),
                            ("dynamic_image_size", '"320,320;640,640"'),
                            ("dynamic_dims", '"20,20;40,40"')):
        parser.add_argument(f"--{option}", metavar=example,
                            help=f"ATC's gears for the -1 dimensions of --input_shape, e.g. "
                                 f"--{option} {example}; at most {MAX_GEARS} gears")
    parser.add_argument("--inputs", help=".npz of real inputs for the check, by input name")
    # the build options' flags (offline_compiler/options.py), placed among the command's own
    add_option_flags(parser, "cache_dir", "cache_trust_group", "jobs")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where PyPTO compiles run: fork servers on this machine, or a Ray "
                             "cluster (pip install 'pypto-offline[ray]'); the blobs are the same")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="the Ray cluster for --executor ray (default: $RAY_ADDRESS, else "
                             "a Ray instance started for this invocation)")
    add_option_flags(parser, "kernel_timeout", "tile_search", "verify")
    parser.add_argument("--fail-on-fallback", action="store_true",
                        help="exit 1 when a planned region fell back to unfused ops; the blob "
                             "and report are still written, each such region's reason is "
                             "printed on stderr; in --json, kernels with status fell_back")
    add_option_flags(parser, "measure_baseline", "compare_platform", "precision_mode",
                     "input_fp16_nodes", "output_type", "keep_dtype")
    _common(parser)
    return parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"pypto-offline {__version__}")


def _load_inputs(path: str | None) -> dict:
    if path is None:
        return {}
    from pypto_offline.verify import load_inputs

    return load_inputs(path)


def run_compile(argv: list[str]) -> int:
    args = compile_parser().parse_args(argv)
    check_atc_options(args)
    from pypto_offline import api
    from pypto_offline.offline_compiler.options import DEFAULT_JOBS

    api.check_limits(1 if args.jobs is None else args.jobs, args.kernel_timeout)
    api.check_cache(args.cache_dir, args.cache_trust_group)  # once, before any build's work
    if args.ray_address and args.executor != "ray":
        raise UsageError("--ray-address is for --executor ray", fix="add --executor ray")
    with output_dir(args.output_dir):  # made for the builds, removed if none writes in it
        builds = builds_of(args)
        inputs = _load_inputs(args.inputs)
        codes, summaries = [], []
        with progress_on_stderr(args.quiet) as progress, \
                api.executor(args.executor, args.ray_address) as executor:
            args.jobs = args.jobs or executor.slots or DEFAULT_JOBS
            with _batch(api, args.jobs, len(builds)):
                for build in builds:
                    code, summary = _run_build(build, args, inputs, progress, executor)
                    codes.append(code)
                    summaries.append(summary)
    if len(builds) > 1 and not (args.json or args.quiet):
        print(_batch_table(summaries))
    return max(codes)


@contextmanager
def _batch(api, jobs: int, builds: int):
    """One worker pool for every build of a batch (a single build makes its own)."""
    if builds == 1:
        yield
        return
    with api.shared_workers(jobs):
        yield


def _run_build(build: Build, args, inputs: dict, progress, executor) -> tuple[int, dict]:
    """Compile, save and print one build; its exit code and summary. Bad input of one model
    (exit 2) does not stop the others: the batch's exit code is the worst."""
    from pypto_offline import api
    from pypto_offline.pypto_kernels.jobs import pool

    from pypto_offline.importer.gears import plan
    from pypto_offline.offline_compiler.summary import verification_failed

    started = time.perf_counter()
    try:
        shapes = plan(build.model, gear_request(build, args), build.model)
        compiled = api.compile(build.model, build.target, shapes.input_shapes,
                               gears=shapes.gears or None, progress=progress,
                               **option_keywords(args), dims=shapes.dims, inputs=inputs,
                               executor=executor)
        pool.raise_if_interrupted()  # an interrupt whose raise was lost: nothing is written
        progress.stage("writing the blob" + (" and the report" if build.report else ""))
        compiled.save(build.output, report=build.report)
    except PyptoOfflineError as err:
        failure = _failure(build, err)
        if args.json:  # one line per requested build, a failed one too (README "JSON output")
            print_summary(failure, args, human_summary)
        if len(args.models) * len(args.target.split(",")) == 1:
            raise
        print(f"pypto-offline: error: {build.model} for {build.target}: "
              f"{printable(str(err))}", file=sys.stderr)
        return EXIT_BAD_INPUT, failure
    summary = {**compiled.summary(), "model": build.model, "blob": str(build.output),
               "report": str(build.report) if build.report else None,
               "kernel_cache": compiled.kernel_cache,
               "compile_seconds": round(time.perf_counter() - started, 2),
               "timings": compiled.timings.as_dict()}
    print_summary(summary, args, human_summary)
    fell_back = [k for k in summary["kernels"] if k["status"] == "fell_back"]
    if args.fail_on_fallback and fell_back:
        print_fallbacks(build, summary["kernels"])
        return EXIT_VERIFY_FAILED, summary
    return EXIT_VERIFY_FAILED if verification_failed(summary) else EXIT_OK, summary


def _failure(build: Build, err: PyptoOfflineError) -> dict:
    """A build that stopped on bad input, as its JSON line says it (schema: build_failure)."""
    from pypto_offline.offline_compiler.summary import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, "model": build.model, "target": build.target,
            "status": "failed", "error": str(err), "exit_code": EXIT_BAD_INPUT}


def _batch_table(summaries: list[dict]) -> str:
    """The batch at a glance: a line per build, a failed one with its exit code."""
    rows = [("model", "target", "kernels", "fell back", "verification", "blob")]
    rows += [(s["model"], s["target"], "-", "-", f"failed (exit {s['exit_code']})", "-")
             if s.get("status") == "failed" else
             (s["model"], s["target"], f"{s['kernels_before']} -> {s['kernels_after']}",
              str(s["pypto"]["fell_back"]), s["verification"]["status"], s["blob"])
             for s in summaries]
    widths = [max(len(printable(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(printable(cell).ljust(width) for cell, width in zip(row, widths))
                     .rstrip() for row in rows)


def run_op(argv: list[str]) -> int:
    from pypto_offline.cli.op_command import describe_op, human_op

    parser = _Parser(prog="pypto-offline op", description="What the compiler does with an op: "
                     "its registry entry and what each stage registered with it.")
    parser.add_argument("name", help="an ONNX op, as the registry names it (Relu, ReduceL1...)")
    _common(parser)
    args = parser.parse_args(argv)
    description = describe_op(args.name)
    print(json.dumps(description, indent=2, sort_keys=True) if args.json else human_op(description))
    return EXIT_OK


def run_targets(argv: list[str]) -> int:
    parser = _Parser(prog="pypto-offline targets", description="The chips and their figures.")
    _common(parser)
    args = parser.parse_args(argv)
    listing = {name: {"notes": t.notes, "chip_names": chip_names(t),
                      **{key: {"value": f.value, "source": f.source, "estimate": f.estimate}
                         for key, f in t.figures().items()}}
               for name, t in TARGETS.items()}
    if args.json:
        from pypto_offline.offline_compiler.summary import SCHEMA_VERSION

        print(json.dumps({"schema_version": SCHEMA_VERSION, "targets": listing}, indent=2,
                         sort_keys=True, default=list))
        return EXIT_OK
    for name, figures in listing.items():
        print(name + (f" — {figures['notes']}" if figures["notes"] else ""))
        print(f"  {'chip names':20s} {', '.join(figures['chip_names'])}  (--target, any case)")
        for key, f in figures.items():
            if key not in ("notes", "chip_names"):
                flag = " [estimate]" if f["estimate"] else ""
                print(f"  {key:20s} {f['value']}{flag}  ({f['source']})")
    return EXIT_OK


def _blob_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=description)
    parser.add_argument("blob", help="a .ptom file")
    _common(parser)
    return parser


def run_inspect(argv: list[str]) -> int:
    parser = _blob_parser("pypto-offline inspect", "Show what a blob holds: every gear's kernels "
                                                   "(--gear N: that gear alone).")
    parser.add_argument("--gear", type=int, metavar="N",
                        help="show gear N alone, every figure its own (0 the first)")
    args = parser.parse_args(argv)
    from pypto_offline import api
    from pypto_offline.offline_compiler.blob import format_version
    from pypto_offline.offline_compiler.summary import provenance

    compiled = api.load(args.blob)
    summary = {**compiled.summary(gear=args.gear), "blob": args.blob,
               "format_version": format_version(compiled.message),
               "provenance": provenance(compiled.message), "gear": args.gear}

    def human(s):
        return "\n".join([human_summary(s), *inspect_gear_text(s, compiled.gear_count),
                          "  kernels:", *kernel_lines(s["kernels"], compiled.gear_count > 1)])

    print_summary(summary, args, human)
    return EXIT_OK


def run_verify(argv: list[str]) -> int:
    parser = _blob_parser("pypto-offline verify", (
        "Check a blob again: each compiled kernel's source derived again from the blob's graph "
        "and tile and compared with the one it holds, and its compiled graph run against its "
        "imported graph in onnxruntime, under the build's memory limits. Exit 1 if either "
        "differs (docs/outputs.md, 'What verify re-checks')."))
    parser.add_argument("--onnx", help="check against this original model instead of the "
                                       "imported graph stored in the blob")
    parser.add_argument("--inputs", help=".npz of real inputs, by input name")
    parser.add_argument("--gear", type=int, metavar="N",
                        help="check gear N only (0 the first; default: every gear)")
    args = parser.parse_args(argv)
    from pypto_offline import api
    from pypto_offline.offline_compiler.summary import verification_failed

    compiled = api.load(args.blob)
    if args.onnx:
        compiled.use_reference(args.onnx)
    compiled.verify(_load_inputs(args.inputs), gear=args.gear)
    # --gear N: that gear's check is the verdict; else every gear's, the worst (docs/gears.md)
    summary = {**compiled.summary(gear=args.gear), "blob": args.blob}
    print_summary(summary, args, human_summary)
    return EXIT_VERIFY_FAILED if verification_failed(summary) else EXIT_OK


def run_report(argv: list[str]) -> int:
    parser = _blob_parser("pypto-offline report",
                          "Write the HTML fusion report of a blob (the page a build writes).")
    parser.add_argument("-o", "--output", help="report path (default: the blob's path, "
                                               ".report.html)")
    args = parser.parse_args(argv)
    from pypto_offline import api
    from pypto_offline.offline_compiler.blob import check_outputs

    path = Path(args.output) if args.output else report_path(Path(args.blob))
    check_outputs({"-o": path}, {"blob": Path(args.blob)})
    from pypto_offline.report.dot import require_dot

    require_dot()
    compiled = api.load(args.blob)
    compiled.write_report(path)
    print_summary({**compiled.summary(), "blob": args.blob, "report": str(path)}, args,
           lambda s: f"report: {s['report']}")
    return EXIT_OK


def run_run(argv: list[str]) -> int:
    """``run``: the blob executed on the host (cli/run_command.py, docs/runtime.md)."""
    from pypto_offline.cli.run_command import run_blob, run_parser

    return run_blob(run_parser(_blob_parser).parse_args(argv))


def cache_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pypto-offline cache", description=(
        "The kernel cache: what it holds, and removing entries (safe while builds use it: "
        "docs/kernel-cache.md)."))
    actions = parser.add_subparsers(dest="action", required=True, metavar="{info,clean}")
    info = actions.add_parser("info", help="the folder, its entries by kind, its size",
                              description="The kernel cache's folder, entries and size.")
    clean = actions.add_parser("clean", help="remove entries (all of them without an option)",
                               description="Remove kernel cache entries: every one without "
                                           "an option.")
    clean.add_argument("--older-than", type=float, metavar="DAYS",
                       help="remove the entries not used for DAYS days")
    clean.add_argument("--max-size", type=float, metavar="GB",
                       help="then remove the least recently used entries until the cache "
                            "holds at most GB gigabytes (10^9 bytes)")
    for action in (info, clean):
        add_option_flags(action, "cache_dir")
        _common(action)
    add_option_flags(clean, "cache_trust_group")
    return parser


def run_cache(argv: list[str]) -> int:
    args = cache_parser().parse_args(argv)
    from pypto_offline.pypto_kernels.cache import cache_folder
    from pypto_offline.pypto_kernels.cache_maintenance import cache_info, clean_cache
    from pypto_offline.pypto_kernels.cache_trust import trust_for

    from pypto_offline.offline_compiler.summary import SCHEMA_VERSION

    folder = cache_folder(args.cache_dir)
    if args.action == "info":
        print_summary({"schema_version": SCHEMA_VERSION, **cache_info(folder)}, args,
               human_cache_info)
    else:
        print_summary({"schema_version": SCHEMA_VERSION,
                **clean_cache(folder, args.older_than, args.max_size,
                              trust=trust_for(args.cache_trust_group))}, args, human_cache_clean)
    return EXIT_OK


def run(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        return {"targets": run_targets, "op": run_op, "inspect": run_inspect, "verify": run_verify,
                "run": run_run, "report": run_report,
                "cache": run_cache}[argv[0]](argv[1:])
    return run_compile(argv)


@contextmanager
def _signals_interrupt():
    """SIGINT and SIGTERM raise BuildInterrupted, so that both end the build the same way (its
    workers killed, its staging folders removed), and are recorded, so that one whose raise is
    lost (a handler run inside a finaliser) still ends it (``pool.interrupt``). The previous
    handlers come back afterwards, as tests call ``main`` in-process; a SIGINT handler other
    than Python's default is left alone. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from pypto_offline.pypto_kernels.jobs import pool

    pool.forget_interrupts()
    numbers = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        numbers.append(signal.SIGINT)
    previous = {number: signal.signal(number, pool.interrupt) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        with _signals_interrupt():
            return run(argv)
    except PyptoOfflineError as err:
        if debug:
            traceback.print_exc()
        print(f"pypto-offline: error: {printable(str(err))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM as a BuildInterrupted
        return interrupted(getattr(interrupt, "signum", signal.SIGINT))
    except Exception as err:  # a bug of ours: say so plainly, traceback only on request
        if debug:
            traceback.print_exc()
        print(f"pypto-offline: internal error: {type(err).__name__}: {printable(str(err))} "
              f"(rerun with --debug and report it)", file=sys.stderr)
        return EXIT_INTERNAL
