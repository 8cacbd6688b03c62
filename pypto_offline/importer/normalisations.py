"""Canonical forms of the ops that normalise over some axes — Softmax, LogSoftmax and the
Layer, Instance and Group normalisations: the axes, epsilon and stash type a kernel reads.
Registered with ``node_context.normaliser`` as the other ops' forms are; ``canonical`` imports this
module so that every normaliser is known wherever it is imported."""
from __future__ import annotations

from typing import Any

from pypto_offline.importer.node_context import NodeContext, NotCanonical, normaliser


@normaliser("Softmax", "LogSoftmax")
def _softmax(ctx: NodeContext) -> dict[str, Any]:
    """Before opset 13 the input is coerced to 2-D at ``axis`` (default 1): the op normalises
    over every axis from ``axis`` on. From 13 it normalises over ``axis`` (default -1) alone."""
    rank = len(ctx.in_shape())
    if ctx.opset < 13:
        return {"axes": tuple(range(ctx.axis(ctx.attr("axis", 1), rank), rank))}
    return {"axes": (ctx.axis(ctx.attr("axis", -1), rank),)}


@normaliser("LayerNormalization")
def _layer_normalization(ctx: NodeContext) -> dict[str, Any]:
    """Normalises over every axis from ``axis`` on. Only the normalised output is canonical:
    a kernel does not write the optional Mean and InvStdDev outputs."""
    rank = len(_normalised_shapes(ctx))
    if any(ctx.node.output[1:]):
        raise NotCanonical("LayerNormalization's Mean or InvStdDev output is used")
    return {"axes": tuple(range(ctx.axis(ctx.attr("axis", -1), rank), rank)),
            "epsilon": float(ctx.attr("epsilon", 1e-5)),
            "stash_type": int(ctx.attr("stash_type", 1))}


@normaliser("InstanceNormalization")
def _instance_normalization(ctx: NodeContext) -> dict[str, Any]:
    """Normalises each channel of each image over the spatial axes, then scales and shifts it
    by the channel's scale and bias (a row of the region's rows: fusion/rows.py). Accumulated
    in fp32 for half-precision inputs, as LayerNormalization's default stash type."""
    rank = len(_normalised_shapes(ctx))
    if rank < 3:
        raise NotCanonical(f"a rank-{rank} input has no spatial axes")
    return {"axes": tuple(range(2, rank)), "epsilon": float(ctx.attr("epsilon", 1e-5)),
            "stash_type": 1}


@normaliser("GroupNormalization")
def _group_normalization(ctx: NodeContext) -> dict[str, Any]:
    """Normalises each of ``groups`` groups of channels of each image over its channels and
    spatial axes: rows of ``C / groups * H * W`` elements (``fusion/rows.reduced_rows``). The
    scale and bias are per group before opset 21, per channel from 21."""
    shape = _normalised_shapes(ctx)
    groups = int(ctx.attr("num_groups", 0))
    if len(shape) < 2 or groups <= 0 or shape[1] % groups:
        raise ctx.error(f"GroupNormalization of {groups} groups over {list(shape)}")
    return {"axes": tuple(range(1, len(shape))), "groups": groups,
            "epsilon": float(ctx.attr("epsilon", 1e-5)),
            "stash_type": int(ctx.attr("stash_type", 1)), "per_channel": int(ctx.opset >= 21)}


def _normalised_shapes(ctx: NodeContext) -> tuple[int, ...]:
    """The input's shape, every parameter's shape known too."""
    for name in ctx.node.input:
        if name:
            ctx.shape(name)
    return ctx.in_shape()
