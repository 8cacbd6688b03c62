"""The builds one compile command asks for: every model for every target once, where each
build's blob and report go (checked before any work: docs/outputs.md), and each model's input
shapes from --input-shape, --input_shape and --dim."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from pypto_offline.cli.text import printable
from pypto_offline.errors import PyptoOfflineError, UsageError


def input_shapes(args) -> dict[str, list[int]]:
    """--input-shape NAME=DIMS and ATC's --input_shape "NAME:DIMS;...", together; each shape
    knows which of the two gave it, and messages name that one (``shape_option``)."""
    from pypto_offline.importer.input_shapes import (parse_atc_shapes, parse_shape_option,
                                                     shape_option)

    given = [parse_shape_option(text) for text in args.input_shape]
    given += [shape for text in args.atc_input_shape for shape in parse_atc_shapes(text)]
    named: dict = {}
    for name, dims in given:
        if name in named:
            first, second = shape_option(named[name]), shape_option(dims)
            said = f"{first} names {name!r} twice" if first == second else \
                f"{first} and {second} both name {name!r}"
            raise UsageError(said, fix="give each input once")
        named[name] = dims
    return named


def once(pairs: list[tuple], option: str, fix: str) -> dict:
    named: dict = {}
    for name, value in pairs:
        if name in named:
            raise UsageError(f"{option} names {name!r} twice", fix=fix)
        named[name] = value
    return named


def blob_path(output: str) -> Path:
    """``-o`` as the blob's path: as given when it ends in .ptom, else ATC's --output form, a
    stem (``out/model`` → ``out/model.ptom``)."""
    if output.endswith(("/", os.sep)):
        raise UsageError(f"-o {output!r} names a folder",
                         fix="give the blob's path or its stem, e.g. -o out/model")
    path = Path(output)
    return path if path.name.lower().endswith(".ptom") else path.with_name(f"{path.name}.ptom")


class Build:
    """One model for one target, where its blob and report go, and its inputs' shapes."""

    def __init__(self, model: str, target: str, output: Path, report: Path | None,
                 shapes: dict[str, list[int]]):
        self.model, self.target, self.output, self.report = model, target, output, report
        self.shapes = shapes


def gear_request(build: Build, args):
    """The shapes and gears a build's options ask for (``importer.gears``): --input-shape and
    --input_shape (-1 where a gear decides), --dim (several values: gears), ATC's gear options,
    --gear-product."""
    from pypto_offline.importer.gears import (ATC_OPTIONS, ONE_WAY, GearRequest,
                                              parse_atc_gears, parse_dim_values)

    dims = once([parse_dim_values(text) for text in args.dim], "--dim",
                "give each dimension once")
    atc = [(option, getattr(args, option)) for option in ATC_OPTIONS
           if getattr(args, option) is not None]
    if len(atc) > 1:
        raise UsageError(f"--{atc[0][0]} and --{atc[1][0]} both give gears", fix=ONE_WAY)
    return GearRequest(build.shapes, dims, (atc[0][0], parse_atc_gears(*atc[0])) if atc
                       else None, args.gear_product)


def shapes_per_model(args) -> dict[str, dict[str, list[int]]]:
    """The ``--input-shape`` options of each model: in a batch, a shape is for the models with
    an input of its name (a model that cannot be read gets them all, and its build says why);
    a name no model has is an error."""
    from pypto_offline import api
    from pypto_offline.importer.input_shapes import shape_option

    shapes = input_shapes(args)
    if len(args.models) == 1:
        return {args.models[0]: shapes}
    per_model, used = {}, set()
    for model in args.models:
        try:
            names = set(api.input_names(model))
        except PyptoOfflineError:
            names = set(shapes)
        per_model[model] = {name: dims for name, dims in shapes.items() if name in names}
        used |= names
    unknown = sorted(set(shapes) - used)
    if unknown:
        raise UsageError(f"{shape_option(shapes[unknown[0]])} names {unknown[0]!r}, an input "
                         f"of none of the models",
                         fix="check the input's name (pypto-offline inspect shows a blob's)")
    return per_model


def builds_of(args) -> list[Build]:
    """Every model for every target, in the order given, with its outputs: ``-o``/``--report``
    for one build, else ``--output-dir`` or beside each model. Every output is checked before
    any work: a compile must not end by failing to write, nor overwrite a model it reads, the
    blob with the report or another build's outputs."""
    from pypto_offline import api
    from pypto_offline.offline_compiler.blob import check_outputs

    targets = list(once_each([name.strip() for name in args.target.split(",")],
                             lambda name: api.get_target(name).name, "--target"))
    args.models = list(once_each(args.models, os.path.realpath, "the models").values())
    pairs = [(model, target) for model in args.models for target in targets]
    if len(pairs) > 1 and (args.output or args.report):
        raise UsageError(f"-o and --report name one build's files, and this is {len(pairs)} "
                         "builds", fix="use --output-dir DIR")
    shapes, builds = shapes_per_model(args), []
    for model, target in pairs:
        name = f"{Path(model).stem}.{target}.ptom"
        output = blob_path(args.output) if args.output else \
            Path(args.output_dir) / name if args.output_dir else Path(model).with_name(name)
        report = None if args.no_report else Path(args.report) if args.report \
            else report_path(output)
        builds.append(Build(model, target, output, report, shapes[model]))
    refuse_shared_outputs(builds)
    # labelled as the user named them: the options of one build, each build's files in a batch
    labels = (lambda b: ("-o", "--report")) if len(builds) == 1 else \
        (lambda b: (f"{b.model} for {b.target}: the blob", f"{b.model} for {b.target}: the report"))
    outputs = {label: path for b in builds
               for label, path in zip(labels(b), (b.output, b.report)) if path}
    if args.output and Path(args.output) != builds[0].output:
        # a stem is checked as given too: one naming a folder, a device or the model itself is
        # a slip, refused, not written beside
        outputs = {"-o": Path(args.output), "the blob": builds[0].output,
                   **{k: v for k, v in outputs.items() if k != "-o"}}
    models = {"input model": Path(args.models[0])} if len(args.models) == 1 else \
        {f"input model {m}": Path(m) for m in args.models}
    check_outputs(outputs, {**models,
                            **({"--inputs file": Path(args.inputs)} if args.inputs else {})})
    if any(b.report for b in builds):
        from pypto_offline.report.dot import require_dot

        require_dot()  # before the work, as the outputs: a build must not end without its report
    return builds


def once_each(given: list[str], identity, what: str) -> dict:
    """Each of ``given`` once by its identity (a chip's target, a model's real path), in the
    order given, with a note for each repeat: a batch builds a model for a target once (two
    builds would write the same files). Identity → the first spelling given."""
    kept: dict = {}
    for value in given:
        same = identity(value)
        if same in kept:
            print(f"pypto-offline: note: {what} name {printable(kept[same])!r} twice (as "
                  f"{printable(value)!r} too): built once", file=sys.stderr)
        else:
            kept[same] = value
    return kept


def refuse_shared_outputs(builds: list[Build]) -> None:
    """Two builds of a batch writing one file (models of one name from two folders, under one
    --output-dir or beside each other through links): refused, with advice a batch can follow."""
    seen: dict[str, Build] = {}
    for build in builds:
        for path in (build.output, build.report):
            if path is None:
                continue
            other = seen.setdefault(os.path.realpath(path), build)
            if other is not build:
                raise UsageError(f"{other.model} and {build.model} for {build.target} would both "
                                 f"write {str(path)!r}", where=str(path),
                                 fix="give the models different file names, or build them in "
                                     "separate runs, each with its own --output-dir")


@contextmanager
def output_dir(folder: str | None):
    """--output-dir for the command's time: created if missing, with its missing parents, and
    those it created removed again at the end if the command left them empty (a refusal found
    after it was made, an unknown chip in a batch, every build failed, an interrupt): a command
    that wrote nothing leaves nothing. A file there (or a link to one, a path through one,
    /dev/null) is the user's slip, refused before any work."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--output-dir {str(folder)!r} is not a folder",
                         fix="give a folder (created if missing), not a file")
    made = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--output-dir {str(folder)!r} cannot be created: {error.strerror}",
                         fix="give a folder you can write to") from None
    try:
        yield
    finally:
        for path in made:  # the deepest first; one holding anything stays, with its parents
            try:
                path.rmdir()
            except OSError:
                break


def report_path(blob: Path) -> Path:
    """MODEL.T.ptom → MODEL.T.report.html, beside it."""
    return blob.with_name(f"{blob.stem}.report.html")

