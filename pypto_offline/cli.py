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

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line."""

    def error(self, message: str):
        raise UsageError(message, fix=f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pypto-offline", description=(
        "Import an ONNX model, fold it to static shapes and normalise every memory-bound op "
        "(the first stage of the offline fusion compiler)."))
    parser.add_argument("model", help="path of the .onnx model")
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


def _print_summary(model_path: str, summary: dict) -> None:
    print(f"{model_path}: opset {summary['opset']}, {summary['nodes_in_source']} nodes "
          f"-> {summary['nodes_after_folding']} after folding, {summary['in_scope']} in scope "
          f"(normalised), imported in {summary['import_seconds']:.2f} s")
    for name, shape in summary["inputs"].items():
        print(f"  input  {name}: {shape}")
    for name, shape in summary["outputs"].items():
        print(f"  output {name}: {shape}")
    if summary["symbolic"]:
        names = ", ".join(summary["symbolic"][:8])
        print(f"  warning: {len(summary['symbolic'])} tensors stay symbolic ({names}); "
              f"give their inputs' shapes with --input-shape")


def run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from pypto_offline.importer import import_model

    graph = import_model(args.model, input_shapes=_input_shapes(args.input_shape))
    summary = graph.summary()
    if args.json:
        print(json.dumps({"model": args.model, **summary}, indent=2, sort_keys=True))
    elif not args.quiet:
        _print_summary(args.model, summary)
    return EXIT_OK


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
