"""A blob of gears (docs/gears.md): the builds of one model at several input sizes in one
message, a kernel identical across gears stored once, and the run-time contract that picks a
gear by the inputs' shapes (an exact match, as ATC's loader does).

    message = pack([(shapes, build.message) for shapes, build in gears])
    build = gear_build(message, index)      # one gear's whole build, its kernels resolved
    index = pick(shapes_of(message), {"x": (1, 3, 320, 320)})
"""
from __future__ import annotations

from typing import Mapping, Sequence

import onnx
from google.protobuf.message import DecodeError

from pypto_offline.errors import ModelError, UsageError
from pypto_offline.offline_compiler import ptom_pb2


def pack(builds: Sequence[tuple[Mapping[str, Sequence[int]], ptom_pb2.CompiledModel]]
         ) -> ptom_pb2.CompiledModel:
    """One message for the gears' builds, in the order given: the first build's fields, and
    every gear's inputs and build with each kernel an earlier gear stores (the same id and
    sha256: the same region, source, tile and figures) replaced by a reference to it."""
    first = ptom_pb2.CompiledModel()
    first.CopyFrom(builds[0][1])
    stored = {(k.id, k.sha256): 0 for k in first.kernels}
    weights = {field: _weights(getattr(first, field)) for field in GRAPHS}
    for index, (shapes, message) in enumerate(builds):
        gear = first.gears.add(inputs=_input_shapes(shapes))
        if index == 0:
            continue
        gear.build.CopyFrom(message)
        for field in GRAPHS:
            setattr(gear.build, field, _share_weights(weights[field], getattr(message, field)))
        for kernel in gear.build.kernels:
            where = stored.setdefault((kernel.id, kernel.sha256), index)
            if where != index:
                reference = ptom_pb2.Kernel(id=kernel.id, sha256=kernel.sha256,
                                            stored_in_gear=where)
                kernel.CopyFrom(reference)
    return first


# The graphs of a build, whose weights the gears share: a later gear's weight equal to the first
# gear's of that name (every field of the tensor) is written as ONNX's external data at this
# location, and read back from the first gear's graph.
GRAPHS = ("onnx_model", "source_onnx_model")
FIRST_GEAR = "pypto-offline: the first gear's graph"


def _weights(graph: bytes) -> dict[str, onnx.TensorProto]:
    """A graph's initializers by name (the first gear's: what the later ones refer to)."""
    return {t.name: t for t in _graph(graph).graph.initializer}


def _share_weights(stored: Mapping[str, onnx.TensorProto], own: bytes) -> bytes:
    model = _graph(own)
    for tensor in model.graph.initializer:
        if stored.get(tensor.name) == tensor:
            reference = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type,
                                         dims=tensor.dims,
                                         data_location=onnx.TensorProto.EXTERNAL)
            reference.external_data.add(key="location", value=FIRST_GEAR)
            tensor.CopyFrom(reference)
    return model.SerializeToString(deterministic=True)


def _own_weights(stored: Mapping[str, onnx.TensorProto], shared: bytes) -> bytes:
    """A later gear's graph with the weights it shares with the first gear's copied back."""
    model = _graph(shared)
    for tensor in model.graph.initializer:
        if _is_shared(tensor):
            tensor.CopyFrom(_stored_weight(stored, tensor))
    return model.SerializeToString(deterministic=True)


def _is_shared(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL and \
        [(e.key, e.value) for e in tensor.external_data] == [("location", FIRST_GEAR)]


def _stored_weight(stored: Mapping[str, onnx.TensorProto], reference: onnx.TensorProto
                   ) -> onnx.TensorProto:
    tensor = stored.get(reference.name)
    if tensor is None or tensor.data_type != reference.data_type \
            or list(tensor.dims) != list(reference.dims):
        raise ModelError(f"blob's gear refers to a weight {reference.name!r} the first gear "
                         f"does not hold", fix="rebuild it with pypto-offline")
    return tensor


def _graph(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model


def _input_shapes(shapes: Mapping[str, Sequence[int]]) -> list[ptom_pb2.InputShape]:
    return [ptom_pb2.InputShape(name=name, dims=[int(d) for d in dims])
            for name, dims in shapes.items()]


def gear_count(message: ptom_pb2.CompiledModel) -> int:
    return max(1, len(message.gears))


def gear_build(message: ptom_pb2.CompiledModel, index: int) -> ptom_pb2.CompiledModel:
    """Gear ``index``'s whole build: for the first the blob's own fields, for the others its
    build with every referenced kernel copied from the gear that stores it. A blob without
    gears is its own one gear."""
    if not message.gears:
        return message
    build = ptom_pb2.CompiledModel()
    build.CopyFrom(message if index == 0 else message.gears[index].build)
    build.ClearField("gears")
    if index:
        for field in GRAPHS:
            setattr(build, field, gear_graph(message, index, field))
    for kernel in build.kernels:
        if kernel.HasField("stored_in_gear"):
            kernel.CopyFrom(_stored(message, kernel))
    return build


def gear_graph(message: ptom_pb2.CompiledModel, index: int, field: str = "onnx_model") -> bytes:
    """Gear ``index``'s graph (``field``: its compiled graph, or its imported one) with the
    weights it shares with the first gear copied back: all a run of it needs."""
    if index == 0 or not message.gears:
        return getattr(message, field)
    return _own_weights(_weights(getattr(message, field)),
                        getattr(message.gears[index].build, field))


def gear_kernels(message: ptom_pb2.CompiledModel, index: int) -> list[ptom_pb2.Kernel]:
    """Gear ``index``'s kernels, each one an earlier gear stores read from there: what its
    build holds, without copying its graphs as ``gear_build`` does."""
    return [_stored(message, k) if k.HasField("stored_in_gear") else k
            for k in build_of(message, index).kernels]


def _stored(message: ptom_pb2.CompiledModel, reference: ptom_pb2.Kernel) -> ptom_pb2.Kernel:
    owner = build_of(message, reference.stored_in_gear)
    return next(k for k in owner.kernels if k.id == reference.id)


def build_of(message: ptom_pb2.CompiledModel, index: int) -> ptom_pb2.CompiledModel:
    """Where gear ``index``'s own record is written (its verification): the blob's fields for
    the first gear, its build's for the others."""
    return message if index == 0 else message.gears[index].build


def shapes_of(message: ptom_pb2.CompiledModel) -> list[dict[str, tuple[int, ...]]]:
    """Each gear's input shapes, in order (a blob without gears: its graph's)."""
    if message.gears:
        return [{s.name: tuple(s.dims) for s in gear.inputs} for gear in message.gears]
    return [graph_shapes(onnx.load_from_string(message.source_onnx_model))]


def graph_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """A graph's inputs' shapes by name (its tensors'): what a gear's row of the table lists."""
    from pypto_offline.importer.input_shapes import graph_inputs

    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
            for v in graph_inputs(model) if v.type.HasField("tensor_type")}


def shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    return "; ".join(f"{name}={','.join(map(str, dims))}" for name, dims in shapes.items())


def pick(gears: Sequence[Mapping[str, tuple[int, ...]]], given: Mapping[str, Sequence[int]]
         ) -> int:
    """The gear (of ``gears``, a blob's ``shapes_of``) whose inputs have exactly the given
    shapes (every input the gears list), or a refusal that lists the gears: the run-time
    contract (docs/gears.md)."""
    wanted = {name: tuple(int(d) for d in dims) for name, dims in given.items()}
    for index, shapes in enumerate(gears):
        if {name: wanted.get(name) for name in shapes} == shapes:
            return index
    listed = " | ".join(f"gear {i}: {shapes_text(s)}" for i, s in enumerate(gears))
    raise UsageError(f"no gear of this blob takes inputs of shapes {shapes_text(wanted)}",
                     fix=f"give the inputs one gear's shapes ({listed}), or build a gear for "
                         f"these")


def check(message: ptom_pb2.CompiledModel, version_has_gears: bool, where: str,
          fix: str, graphs: Mapping[str, onnx.ModelProto] | None = None) -> None:
    """A blob's gears as every reader relies on them: present exactly when its format version
    says so, each gear's inputs distinct and exactly its graphs' inputs (names and sizes of at
    least 1), the first without a build of its own and the others with one of the same model
    for the same target, every reference to a kernel an earlier gear stores under that id with
    that sha256. ``graphs``: the blob's own graphs by field, when the reader parsed them
    already (each graph is parsed once)."""
    if bool(message.gears) != version_has_gears:
        raise ModelError("blob's gears do not match its format version", where=where, fix=fix)
    if not message.gears:
        return
    if len(message.gears) < 2:
        raise ModelError("blob has a gear table of one gear", where=where, fix=fix)
    graphs = graphs or {field: _parsed(message, field, 0, where, fix) for field in GRAPHS}
    weights = {field: {t.name: t for t in graphs[field].graph.initializer} for field in GRAPHS}
    seen = set()
    for index, gear in enumerate(message.gears):
        key = _key((s.name, s.dims) for s in gear.inputs)
        if not key or key in seen:
            raise ModelError(f"blob's gear {index} has no inputs or another gear's", where=where,
                             fix=fix)
        seen.add(key)
        if gear.HasField("build") != (index > 0):
            raise ModelError(f"blob's gear {index} {'lacks' if index else 'has'} a build of its "
                             f"own", where=where, fix=fix)
        if index:
            _check_gear_build(message, index, weights, where, fix)
        else:
            _check_inputs(gear, 0, graphs, where, fix)


def check_distinct(gears: Sequence[Mapping[str, Sequence[int]]]) -> None:
    """Gears to build, as ``check`` will read them back: each with input shapes, no two the
    same (a loader picks a gear by its inputs' shapes; a blob of two identical gears would be
    refused by every reader). Checked before any work."""
    empty = [index for index, shapes in enumerate(gears) if not shapes]
    if empty:
        raise UsageError(f"gear {empty[0]} gives no input shapes",
                         fix="give each gear its inputs' shapes, e.g. {'x': [1, 64]}")
    pair = repeated(gears)
    if pair:
        raise UsageError(f"gears {pair[0]} and {pair[1]} have the same input shapes "
                         f"({shapes_text(gears[pair[1]])})", fix="give each gear once")


def repeated(gears: Sequence[Mapping[str, Sequence[int]]]) -> tuple[int, int] | None:
    """The first gear with an earlier gear's input shapes, as (the earlier's index, its own),
    or None."""
    seen: dict[tuple, int] = {}
    for index, shapes in enumerate(gears):
        earlier = seen.setdefault(_key(shapes.items()), index)
        if earlier != index:
            return earlier, index
    return None


def _key(shapes) -> tuple:
    """A gear's identity, from its (input name, dims) pairs: what tells it from another."""
    return tuple(sorted((name, tuple(dims)) for name, dims in shapes))


def _check_gear_build(message: ptom_pb2.CompiledModel, index: int,
                      weights: Mapping[str, Mapping[str, onnx.TensorProto]], where: str,
                      fix: str) -> None:
    build = message.gears[index].build
    if build.gears or build.target.name != message.target.name or \
            build.provenance.model_sha256 != message.provenance.model_sha256:
        raise ModelError(f"blob's gear {index} is not a build of its model for its target",
                         where=where, fix=fix)
    graphs = {field: _parsed(build, field, index, where, fix) for field in GRAPHS}
    for field, graph in graphs.items():
        try:
            for tensor in graph.graph.initializer:
                if _is_shared(tensor):
                    _stored_weight(weights[field], tensor)
        except ModelError as error:
            raise ModelError(f"{error.what} (gear {index})", where=where, fix=fix) from None
    _check_inputs(message.gears[index], index, graphs, where, fix)
    for kernel in build.kernels:
        if not kernel.HasField("stored_in_gear"):
            continue
        owner = kernel.stored_in_gear
        stored = [k for k in build_of(message, owner).kernels if k.id == kernel.id] \
            if 0 <= owner < index else []
        if len(stored) != 1 or stored[0].HasField("stored_in_gear") \
                or stored[0].sha256 != kernel.sha256:
            raise ModelError(f"blob's gear {index} refers to a kernel {kernel.id!r} that gear "
                             f"{owner} does not store", where=where, fix=fix)


def _parsed(build: ptom_pb2.CompiledModel, field: str, index: int, where: str,
            fix: str) -> onnx.ModelProto:
    try:
        return _graph(getattr(build, field))
    except DecodeError:
        raise ModelError(f"blob's gear {index} {field} does not parse as ONNX", where=where,
                         fix=fix) from None


def _check_inputs(gear: ptom_pb2.Gear, index: int, graphs: Mapping[str, onnx.ModelProto],
                  where: str, fix: str) -> None:
    """A gear's row of the table is exactly what its graphs take: a loader picks the gear by
    the row and then runs the graph, so a row that claims other shapes (or names, or one input
    too many or too few) would run a graph on inputs it was not built for."""
    claimed = sorted((s.name, tuple(s.dims)) for s in gear.inputs)
    if any(d < 1 for _, dims in claimed for d in dims):
        raise ModelError(f"blob's gear {index} lists a dimension below 1 "
                         f"({shapes_text(dict(claimed))})", where=where, fix=fix)
    for field, graph in graphs.items():
        taken = graph_shapes(graph)
        if claimed != sorted(taken.items()):
            raise ModelError(f"blob's gear {index} lists inputs {shapes_text(dict(claimed))} but "
                             f"its {field} takes {shapes_text(taken) or 'none'}", where=where,
                             fix=fix)
