"""A blob's kernel sources derived again: what ``pypto-offline verify`` checks of its kernels
(docs/outputs.md, "What verify re-checks").

    check = recheck_sources(message)   # SourceCheck: which kernels match, which differ and why

A blob is hostile input, and nothing from it is executed here. Its imported graph is imported
again as a build imports a model (``import_model``: from bytes, so no external data file is
read); each compiled kernel's region is rebuilt from the nodes its record names, as the
partition makes one (``fusion.make_region``), and the module the generator writes for that
region under the record's tuned tile (``codegen.kernel_source``, the build's own generator) is
compared with the record's source byte for byte, as the kernel cache compares a cached entry's
source with the one generated for this build (``pypto_kernels.entries.cached_kernel``). A
kernel that fell back ships its ops unfused: it has no source to check. PyPTO's artifacts
(program.json, the AICore sources) are not derived again: that needs a PyPTO compile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx

from pypto_offline.errors import PyptoOfflineError
from pypto_offline.fusion import Region, make_region
from pypto_offline.fusion.classify import node_id
from pypto_offline.fusion.lower import DOMAIN
from pypto_offline.importer import ImportedGraph, Node, import_model
from pypto_offline.offline_compiler import ptom_pb2
from pypto_offline.offline_compiler.messages import op_message, region_signature
from pypto_offline.pypto_kernels.codegen import kernel_source
from pypto_offline.pypto_kernels.tiling import TilePolicy
from pypto_offline.targets import Target, resolve_target


@dataclass(frozen=True)
class Mismatch:
    """A kernel the blob ships whose record is not what the build's generator makes of it."""

    kernel: str
    reason: str


@dataclass(frozen=True)
class SourceCheck:
    """The compiled kernels' sources derived again from the blob's graph and tiles."""

    compiled: int                        # kernels the blob ships: each has a source to check
    matching: int                        # of those, whose source is byte for byte the one derived
    mismatches: tuple[Mismatch, ...]     # those that are not, and why (one per kernel)
    fell_back: tuple[str, ...]           # kernels whose ops ship unfused: no source to check

    @property
    def passed(self) -> bool:
        return not self.mismatches


def recheck_sources(message: ptom_pb2.CompiledModel) -> SourceCheck:
    compiled = [k for k in message.kernels if k.compiled]
    reasons = _calls_that_disagree(message)
    source = _Source.of(message)
    for kernel in compiled:
        if kernel.id not in reasons:
            why = source if isinstance(source, str) else source.why_it_differs(kernel)
            if why is not None:
                reasons[kernel.id] = why + _version_note(message)
    return SourceCheck(
        compiled=len(compiled), matching=sum(k.id not in reasons for k in compiled),
        mismatches=tuple(Mismatch(kernel, why) for kernel, why in reasons.items()),
        fell_back=tuple(k.id for k in message.kernels if not k.compiled))


def _calls_that_disagree(message: ptom_pb2.CompiledModel) -> dict[str, str]:
    """Kernel id -> why, for each call of the compiled graph to a kernel the blob does not ship
    and each shipped kernel the graph does not call: a kernel marked as fallen back would
    otherwise escape the check while the graph still calls it."""
    graph = onnx.load_from_string(message.onnx_model).graph
    called = {node.op_type for node in graph.node if node.domain == DOMAIN}
    shipped = {k.id for k in message.kernels if k.compiled}
    recorded = {k.id for k in message.kernels}
    reasons = {kernel: "the compiled graph calls it, but the blob "
                       + ("records it as fallen back" if kernel in recorded
                          else "has no such kernel")
               for kernel in sorted(called - shipped)}
    reasons.update({kernel: "the blob says it compiled, but the compiled graph never calls it"
                    for kernel in sorted(shipped - called)})
    return reasons


def derivation(imported: bytes, target: str) -> _Source | str:
    """What a kernel of a blob's graph ``imported`` (for ``target``, a target's name) is
    derived from: its region (``region``) and constants, and whether its record's source is the
    generator's (``why_it_differs``, None when it is); or why the graph does not import. The
    reference runtime runs a kernel from these (offline_compiler/execute.py)."""
    return _Source.of_graph(imported, target)


@dataclass(frozen=True)
class _Source:
    """What a kernel's source is derived from: the blob's graph imported again, its nodes by id,
    its constants, the target."""

    graph: ImportedGraph
    nodes: Mapping[str, Node]
    constants: Mapping[str, np.ndarray]
    target: Target

    @classmethod
    def of(cls, message: ptom_pb2.CompiledModel) -> _Source | str:
        """Or why the graph cannot be imported again: then no kernel can be derived, which is
        the verdict on each (the caller has applied the memory limits before)."""
        return cls.of_graph(message.source_onnx_model, message.target.name)

    @classmethod
    def of_graph(cls, imported: bytes, target: str) -> _Source | str:
        """A blob's (or a gear's) imported graph and target name, as ``of`` takes them."""
        try:
            graph = import_model(imported)
        except PyptoOfflineError as error:
            return f"cannot be derived again: the blob's imported graph does not import ({error})"
        return cls(graph, {node_id(node): node for node in graph.nodes}, graph.constant_values(),
                   resolve_target(target))

    def region(self, kernel: ptom_pb2.Kernel) -> Region:
        """The kernel's region as the partition makes it from the nodes its record names (the
        record's nodes must be the graph's: ``why_it_differs`` says when they are not)."""
        return make_region(kernel.id, [self.nodes[name] for name in kernel.nodes], self.graph,
                           self.target)

    def why_it_differs(self, kernel: ptom_pb2.Kernel) -> str | None:
        """None when the record's source is the one the generator writes for its region and
        tuned tile; else what differs, the first thing found."""
        missing = [name for name in kernel.nodes if name not in self.nodes]
        if missing or not kernel.nodes:
            return (f"its region names nodes the blob's graph does not have: {missing[:3]}"
                    if missing else "its region names no node")
        if not kernel.HasField("tuned_tile"):
            return "it records no tuned tile to derive its source under"
        tile = kernel.tuned_tile
        policy = TilePolicy(tile.budget_bytes, tile.swapped_transposes, tile.flat_rows,
                            tile.vec_merge)
        try:  # whatever the generator makes of a hostile record is text, never run
            region = self.region(kernel)
            differ = _record_differs(kernel, region)
            if differ:
                return (f"its region record is not the region the blob's graph gives for its "
                        f"nodes: {', '.join(differ)} differ")
            derived = kernel_source(region, policy, self.constants)
        except Exception as error:  # noqa: BLE001 - a record the generator cannot take
            return f"its source cannot be derived again: {type(error).__name__}: {error}"
        if derived != kernel.source:
            return (f"its source is not the one the generator writes for its region and tile "
                    f"{policy.name} (first difference at line "
                    f"{_first_difference(derived, kernel.source)})")
        return None


def _record_differs(kernel: ptom_pb2.Kernel, region: Region) -> list[str]:
    """The parts of a kernel's region record (as ``build`` writes them) that the region rebuilt
    from the blob's graph does not give: what the report shows of a kernel is checked too."""
    rebuilt = {"inputs": list(region.inputs), "outputs": list(region.outputs),
               "original ops": [op_message(op) for op in region.original],
               "simplified ops": [op_message(op) for op in region.simplified],
               "rules applied": list(region.rules_applied),
               "signature": [region_signature(region)]}
    recorded = {"inputs": list(kernel.inputs), "outputs": list(kernel.outputs),
                "original ops": list(kernel.original), "simplified ops": list(kernel.simplified),
                "rules applied": list(kernel.rules_applied),
                "signature": [kernel.region_signature]}
    return [part for part in rebuilt if rebuilt[part] != recorded[part]]


def _first_difference(derived: str, stored: str) -> int:
    one, other = derived.splitlines(), stored.splitlines()
    return next((n for n, (a, b) in enumerate(zip(one, other), 1) if a != b),
                min(len(one), len(other)) + 1)


def _version_note(message: ptom_pb2.CompiledModel) -> str:
    """A blob of another pypto-offline release may hold another generator's sources: say so."""
    from pypto_offline import __version__

    built_by = message.provenance.tool_version
    return "" if built_by == __version__ else (
        f"; the blob was built by pypto-offline {built_by}, this is {__version__}: rebuild it "
        f"to compare with this generator")
