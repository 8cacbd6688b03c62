"""ATC's spellings of the compile command, where they mean what ours do (README "Using it",
docs/outputs.md "ATC's spellings"): ``--model=FILE`` is a MODEL argument, ``--framework 5`` says
the model is ONNX (the only framework read), ``--input_format`` is checked against the model
(``importer/input_format.py``). ``--output``, ``--soc_version`` and ``--input_shape`` are declared
beside ours, in ``compile_parser``; ``--input_format`` and the precision options are build options,
spelled in ``offline_compiler/options.py``."""
from __future__ import annotations

from pypto_offline.cli.flags import add_option_flags
from pypto_offline.errors import UsageError

# ATC's --framework values; pypto-offline reads the last one only
FRAMEWORKS = {0: "Caffe", 1: "MindSpore", 3: "TensorFlow", 5: "ONNX"}
ONNX = 5


def add_atc_options(parser) -> None:
    parser.add_argument("--model", dest="atc_models", action="append", default=[],
                        metavar="FILE",
                        help="ATC's spelling of a MODEL argument: --model=model.onnx (with MODEL "
                             "arguments or repeated: every model, one batch)")
    parser.add_argument("--framework", metavar="5",
                        help="ATC's: 5, ONNX, the only framework read (any other value is "
                             "refused)")
    add_option_flags(parser, "input_format")  # a build option: offline_compiler/options.py


def check_atc_options(args) -> None:
    """Before any work: the models of MODEL and --model together, --framework and
    --input_format's values (the latter upper-cased)."""
    from pypto_offline.importer.input_format import parse_input_format

    args.models = [*args.models, *args.atc_models]
    if not args.models:
        raise UsageError("no model given",
                         fix="give the .onnx model's path, or ATC's --model=FILE")
    if args.framework is not None and _framework(args.framework) != ONNX:
        known = FRAMEWORKS.get(_framework(args.framework))
        raise UsageError(f"--framework {args.framework}"
                         f"{f' ({known})' if known else ''}: pypto-offline reads ONNX models "
                         f"only (--framework 5)",
                         fix="export the model to ONNX, or leave --framework out")
    if args.input_format is not None:
        args.input_format = parse_input_format(args.input_format)


def _framework(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
