"""Gears: the input sizes one blob is compiled for (docs/gears.md).

    plan = plan(model, GearRequest(shapes, dims, atc, product), label)

ATC's three spellings take ``-1`` dimensions in ``--input_shape`` and give their values per gear:
``--dynamic_batch_size "1,2,4"`` (every ``-1`` takes the gear's one value),
``--dynamic_image_size "320,320;640,640"`` (each input's two ``-1``, its height and width, take the
gear's pair) and ``--dynamic_dims "20,20,1;40,40,2"`` (the ``-1`` of every input, in the order the
shapes are given, take the gear's values in order). Ours names a symbolic dimension of the model:
``--dim NAME=V1,V2,...``, repeatable; the gears are the listed values taken together, the i-th of
each (as ``--dynamic_dims`` lists them), or with ``--gear-product`` every combination.

``plan`` gives each gear as the full static shape of every model input: the build of a gear
does not depend on how its gears were spelled, so two spellings of the same gears give the same
blob. One gear is no gears: its shapes are an ordinary build's ``--input-shape``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import onnx

from pypto_offline.errors import UsageError
from pypto_offline.importer.input_shapes import (GivenShape, check_named_dims, graph_inputs,
                                                  shape_option, symbolic_dims,
                                                  symbolic_input_error)

# ATC's limit on the gears of one model (--dynamic_batch_size and the others: at most 100)
MAX_GEARS = 100
ATC_OPTIONS = ("dynamic_batch_size", "dynamic_image_size", "dynamic_dims")
DYNAMIC = -1  # ATC's dimension of a gear in --input_shape
ONE_WAY = ("give gears one way: -1 dimensions in --input_shape with one of --dynamic_batch_size, "
           "--dynamic_image_size and --dynamic_dims, or --dim NAME=V1,V2,...")


@dataclass(frozen=True)
class GearRequest:
    """The gears the options ask for, before the model is read: ``shapes`` (``--input-shape``
    and ``--input_shape``, ``-1`` where a gear decides), ``dims`` (``--dim``, a tuple of values
    each), ``atc`` (which of ATC's options and its gears' values)."""

    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    atc: tuple[str, tuple[tuple[int, ...], ...]] | None = None
    product: bool = False

    @property
    def geared_dims(self) -> dict[str, tuple[int, ...]]:
        return {name: values for name, values in self.dims.items() if len(values) > 1}

    @property
    def static_dims(self) -> dict[str, int]:
        return {name: values[0] for name, values in self.dims.items() if len(values) == 1}


def parse_atc_gears(option: str, text: str) -> tuple[tuple[int, ...], ...]:
    """One of ATC's gear options' text → each gear's values: ``"1,2,4"`` for
    ``dynamic_batch_size`` (a value a gear), ``"H,W;H,W"`` and ``"a,b,c;a,b,c"`` for the others
    (a gear between semicolons)."""
    example = {"dynamic_batch_size": '--dynamic_batch_size "1,2,4"',
               "dynamic_image_size": '--dynamic_image_size "320,320;640,640"',
               "dynamic_dims": '--dynamic_dims "20,20,1;40,40,2"'}[option]
    parts = text.split(",") if option == "dynamic_batch_size" else text.split(";")
    try:
        gears = tuple(tuple(int(v) for v in part.split(",")) for part in parts if part.strip())
    except ValueError:
        raise UsageError(f"--{option} {text!r}: the values must be whole numbers",
                         fix=f"for example {example}") from None
    if not gears:
        raise UsageError(f"--{option} {text!r} gives no gear", fix=f"for example {example}")
    if option == "dynamic_image_size" and any(len(g) != 2 for g in gears):
        raise UsageError(f"--{option} {text!r}: each gear is a height and a width",
                         fix=f"for example {example}")
    return gears


def parse_dim_values(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=V1,V2,...`` (``--dim``) → (name, values); one value fixes the dimension."""
    name, sep, values = text.partition("=")
    example = "for example --dim batch=1, or --dim past=16,32,64 for three gears"
    if not sep or not name.strip():
        raise UsageError(f"--dim {text!r} is not NAME=VALUE or NAME=V1,V2,...", fix=example)
    try:
        return name.strip(), tuple(int(v) for v in values.split(","))
    except ValueError:
        raise UsageError(f"--dim {text!r}: the values must be whole numbers",
                         fix=example) from None


def gear_values(request: GearRequest) -> list[dict]:
    """Each gear as the values it gives: {input: its -1 dims' values} for ATC's spellings,
    {dimension name: value} for ``--dim``; one empty gear when none is asked for."""
    dynamic = {name: [a for a, d in enumerate(dims) if d == DYNAMIC]
               for name, dims in request.shapes.items() if DYNAMIC in dims}
    geared = request.geared_dims
    if request.atc and geared:
        raise UsageError("both ATC's gears and --dim with several values", fix=ONE_WAY)
    if request.product and not geared:
        raise UsageError("--gear-product takes the --dim values with several values each",
                         fix="give two --dim NAME=V1,V2,... or leave --gear-product out")
    if request.atc:
        _check_count(len(request.atc[1]))
        gears = _atc_gears(request.atc, dynamic, request.shapes)
    elif dynamic:
        name = next(iter(dynamic))
        raise UsageError(f"{shape_option(request.shapes[name])} gives input {name!r} a -1 "
                         f"dimension, the mark of a gear, and no gears", fix=ONE_WAY)
    else:
        gears = _dim_gears(geared, request.product)
    _check_given_once(gears)
    return gears


def _atc_gears(atc, dynamic: Mapping[str, list[int]],
               shapes: Mapping[str, Sequence[int]]) -> list[dict]:
    option, values = atc
    if not dynamic:
        raise UsageError(f"--{option} gives gears, and --input_shape no -1 dimension for them",
                         fix='mark the dimensions with -1, e.g. --input_shape "x:-1,3,224,224"')
    count = sum(len(axes) for axes in dynamic.values())
    gears = []
    for gear in values:
        if option == "dynamic_batch_size":
            gears.append({name: [gear[0]] * len(axes) for name, axes in dynamic.items()})
            continue
        if option == "dynamic_image_size":
            wrong = [name for name, axes in dynamic.items() if len(axes) != 2]
            if wrong:
                raise UsageError(f"--dynamic_image_size gives a height and a width, and input "
                                 f"{wrong[0]!r} has {len(dynamic[wrong[0]])} -1 dimension(s)",
                                 fix="mark an image's height and width with -1")
            gears.append({name: list(gear) for name in dynamic})
            continue
        if len(gear) != count:
            raise UsageError(f"--dynamic_dims gear {','.join(map(str, gear))} has {len(gear)} "
                             f"value(s), and {shape_option(shapes[next(iter(dynamic))])} "
                             f"{count} -1 dimension(s)",
                             fix="give each gear a value for every -1, in the order of the shapes")
        values_left = iter(gear)
        gears.append({name: [next(values_left) for _ in axes] for name, axes in dynamic.items()})
    return gears


def _dim_gears(geared: Mapping[str, tuple[int, ...]], product: bool) -> list[dict]:
    if not geared:
        return [{}]
    names, lengths = list(geared), [len(values) for values in geared.values()]
    if product:
        # counted before they are made: 3000 x 3000 values would be 9,000,000 gears in memory
        _check_count(math.prod(lengths), f" (--gear-product of {' x '.join(map(str, lengths))}"
                                         f" values)")
        return [dict(zip(names, combination))
                for combination in itertools.product(*geared.values())]
    if len(set(lengths)) > 1:
        listed = ", ".join(f"{name} {len(values)}" for name, values in geared.items())
        raise UsageError(f"--dim lists gears of different counts ({listed}): the gears are "
                         f"their i-th values taken together",
                         fix="give each the same number of values, or add --gear-product for "
                             "every combination")
    _check_count(lengths[0])
    return [dict(zip(names, combination)) for combination in zip(*geared.values())]


def _check_count(count: int, how: str = "") -> None:
    if count > MAX_GEARS:
        raise UsageError(f"{count} gears{how}: at most {MAX_GEARS} (ATC's limit)",
                         fix="build fewer gears, or several blobs")


def _check_given_once(gears: list[dict]) -> None:
    seen = set()
    for gear in gears:
        key = repr(sorted(gear.items()))
        if key in seen:
            raise UsageError(f"the gear {_gear_text(gear)} is given twice",
                             fix="give each gear once")
        seen.add(key)


def _gear_text(gear: Mapping) -> str:
    return ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in gear.items())


@dataclass(frozen=True)
class Plan:
    """What a command's shape options build: one shape (``input_shapes`` and ``dims``, as an
    ordinary build takes them) or, with two gears or more, each gear's every input shape."""

    input_shapes: dict[str, list[int]]
    dims: dict[str, int]
    gears: list[dict[str, list[int]]]


def plan(source, request: GearRequest, label: str) -> Plan:
    """The build or the gears ``request`` asks for. One gear is an ordinary build: its ``-1``
    dims filled, its ``--dim`` values as ``dims``; it does not read the model, and its blob is
    the one the same shapes given without gears make. Two or more: each gear as every model
    input's full shape, in the order given, each fixed as an ordinary build fixes its shapes
    (``fix_input_shapes``) before any work: a gear that contradicts a static dimension, or a
    ``--dim`` that names none (checked before the gears are counted), is refused as a shape is,
    and so are two gears that come out the same."""
    inputs = None
    if request.geared_dims:
        inputs = _model_inputs(source)
        check_named_dims(graph_inputs(inputs),
                         {name: values[0] for name, values in request.dims.items()}, label)
    values = gear_values(request)
    if len(values) == 1:
        return Plan(*_options_of(request, values[0]), [])
    inputs = inputs or _model_inputs(source)
    gears = [_shapes_of(inputs, request, gear, label) for gear in values]
    _check_distinct(inputs, request, values, gears, label)
    return Plan({}, {}, gears)


def _model_inputs(source) -> onnx.ModelProto:
    from pypto_offline.importer.loading import load_model

    return _inputs_only(load_model(source)[0])


def _check_distinct(inputs: onnx.ModelProto, request: GearRequest, values: list[dict],
                    gears: list[dict[str, list[int]]], label: str) -> None:
    """Two gears of different values with the same shapes of every input (a blob whose loader
    could not tell them apart): refused, naming why. Mostly --dim values of a dimension only
    inputs whose whole shape is given have (--dim batch=1,2 --input-shape x=3,64)."""
    from pypto_offline.offline_compiler.gears import repeated, shapes_text

    pair = repeated(gears)
    if pair is None:
        return
    first, second = (values[index] for index in pair)
    changed = [name for name in first if first[name] != second.get(name)]
    having = [v.name for v in graph_inputs(inputs) if v.type.HasField("tensor_type")
              and set(symbolic_dims(v)) & set(changed)]
    same = (f"gears {pair[0]} ({_gear_text(first)}) and {pair[1]} ({_gear_text(second)}) "
            f"have the same shapes ({shapes_text(gears[pair[0]])})")
    if having and set(having) <= set(request.shapes):
        dims, given = ", ".join(changed), ", ".join(having)
        option = shape_option(request.shapes[having[0]])
        raise UsageError(f"{same}: --dim {dims} sizes only {given}, whose shape {option} "
                         f"gives", where=label,
                         fix=f"leave {given} out of {option}, or give --dim {dims} one value")
    raise UsageError(f"{same}: no input's shape changes between them", where=label,
                     fix="give gears whose values change an input's shape")


def _options_of(request: GearRequest, gear: Mapping) -> tuple[dict, dict]:
    """A gear as an ordinary build's options: the given shapes with their -1 dims the gear's
    values (ATC's spellings), and the named dimensions (one-value ``--dim`` and the gear's
    own, ours)."""
    shapes = {}
    for name, dims in request.shapes.items():
        values = iter(gear.get(name, []) if request.atc else [])
        shapes[name] = GivenShape([next(values, DYNAMIC) if d == DYNAMIC else d for d in dims],
                                  shape_option(dims))
    return shapes, {**request.static_dims, **({} if request.atc else gear)}


def _inputs_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's inputs alone (no initializer, no node): what a gear's shapes are fixed
    in, copied once per gear."""
    light = onnx.ModelProto()
    light.graph.input.extend(graph_inputs(model))
    return light


def _shapes_of(inputs: onnx.ModelProto, request: GearRequest, gear: Mapping,
               label: str) -> dict[str, list[int]]:
    """One gear's shape of every input, fixed by its options as an ordinary build's are; a
    dimension still open is refused as there."""
    from pypto_offline.importer.input_shapes import fix_input_shapes

    model = onnx.ModelProto()
    model.CopyFrom(inputs)
    shapes, dims = _options_of(request, gear)
    fix_input_shapes(model, shapes, label, dims)
    fixed = {}
    for value in graph_inputs(model):
        if not value.type.HasField("tensor_type"):
            continue
        dims_of = value.type.tensor_type.shape.dim
        if not value.type.tensor_type.HasField("shape") or any(
                not d.HasField("dim_value") or d.dim_value <= 0 for d in dims_of):
            raise symbolic_input_error(value, label)
        fixed[value.name] = [d.dim_value for d in dims_of]
    return fixed
