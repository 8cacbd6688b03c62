"""``pypto-offline``: a thin shell over the Python API. Parsing and printing only.

Exit codes: 0 success, 1 verification failed, 2 bad input or usage (one message, no traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

from pypto_offline import __version__
from pypto_offline.errors import PyptoOfflineError, UsageError
from pypto_offline.targets import TARGETS

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line."""

    def error(self, message: str):
        raise UsageError(message, fix=f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pypto-offline", description=(
        "Import an ONNX model, fuse its memory-bound ops into kernel regions for a Huawei NPU, "
        "and check the fused graph against onnxruntime."))
    parser.add_argument("model", help="path of the .onnx model")
    parser.add_argument("--target", default="kirin9050", help=f"chip ({', '.join(TARGETS)})")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the onnxruntime check of the fused graph")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                        help="fix the shape of a model input (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"pypto-offline {__version__}")
    return parser


def _input_shapes(options: list[str]) -> dict[str, list[int]]:
    from pypto_offline.importer.input_shapes import parse_shape_option

    shapes: dict[str, list[int]] = {}
    for text in options:
        name, dims = parse_shape_option(text)
        if name in shapes:
            raise UsageError(f"--input-shape gives {name!r} twice", fix="give each input once")
        shapes[name] = dims
    return shapes


def _target(name: str):
    if name not in TARGETS:
        raise UsageError(f"unknown target {name!r}", fix=f"choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


def _print_summary(model_path: str, summary: dict) -> None:
    imported = summary["import"]
    print(f"{model_path}: opset {imported['opset']}, {imported['nodes_in_source']} nodes "
          f"-> {imported['nodes_after_folding']} after folding, imported in "
          f"{imported['import_seconds']:.2f} s")
    for name, shape in imported["inputs"].items():
        print(f"  input  {name}: {shape}")
    for name, shape in imported["outputs"].items():
        print(f"  output {name}: {shape}")
    if imported["symbolic"]:
        names = ", ".join(imported["symbolic"][:8])
        print(f"  warning: {len(imported['symbolic'])} tensors stay symbolic ({names}); "
              f"give their inputs' shapes with --input-shape")
    fusion = summary["fusion"]
    print(f"  target {summary['target']}: kernels {fusion['kernels_before']} -> "
          f"{fusion['kernels_after']} ({fusion['fused_kernels']} fused kernels of "
          f"{fusion['ops_fused']} ops), global memory {fusion['gm_bytes_before'] / 1e6:.2f} -> "
          f"{fusion['gm_bytes_after'] / 1e6:.2f} MB, estimated "
          f"{fusion['est_time_us_before']:.1f} -> {fusion['est_time_us_after']:.1f} us "
          f"(bandwidth and launch cost are estimates)")
    check = summary["verification"]
    print(f"  verification: {check['status']}" + (
        f" (max abs diff {check['max_abs_diff']:.2e})" if check["status"] != "skipped" else ""))


def run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from dataclasses import asdict

    from pypto_offline.fusion import plan_fusion
    from pypto_offline.importer import import_model
    from pypto_offline.verify import compare, generate_inputs

    target = _target(args.target)
    graph = import_model(args.model, input_shapes=_input_shapes(args.input_shape))
    plan = plan_fusion(graph, target)
    verification = {"status": "skipped"}
    if not args.no_verify and not graph.symbolic:
        result = compare(graph.model, plan.compiled_model, generate_inputs(graph.model, seed=0))
        verification = {"status": result.status, "max_abs_diff": result.max_abs_diff}
    summary = {"model": args.model, "target": target.name, "import": graph.summary(),
               "fusion": asdict(plan.totals), "verification": verification}
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    elif not args.quiet:
        _print_summary(args.model, summary)
    return EXIT_VERIFY_FAILED if verification["status"] == "failed" else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        return run(argv)
    except PyptoOfflineError as err:
        if debug:
            traceback.print_exc()
        print(f"pypto-offline: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("pypto-offline: interrupted", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as err:  # a bug of ours: say so plainly, traceback only on request
        if debug:
            traceback.print_exc()
        print(f"pypto-offline: internal error: {type(err).__name__}: {err} "
              f"(rerun with --debug and report it)", file=sys.stderr)
        return EXIT_INTERNAL
