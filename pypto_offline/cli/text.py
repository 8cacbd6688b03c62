"""What the command line prints: the progress lines on stderr, the human summaries, the one way
a summary reaches stdout, and ``printable``, through which every string from a model goes
(docs/outputs.md)."""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

from pypto_offline.progress import SILENT, Progress


class StderrProgress(Progress):
    """Progress as plain lines on stderr, a terminal's or a CI log's: stage lines with the time
    since the start, one line per finished kernel. On a terminal, a running count of finished
    kernels stays on the last line, redrawn in place (never in a log, where it would be noise).
    Every string from the model goes through ``printable`` (docs/outputs.md)."""

    def __init__(self, stream):
        self._stream = stream
        self._terminal = stream.isatty()
        self._started = time.perf_counter()
        self._status = ""  # the running count on the terminal's last line, if drawn

    def stage(self, name: str) -> None:
        self._line(f"[{time.perf_counter() - self._started:6.1f} s] {printable(name)}")

    def kernel(self, done: int, total: int, region, kernel) -> None:
        self._line(kernel_line(done, total, region, kernel),
                   status=f"[{done}/{total}] kernels finished" if done < total else "")

    def close(self) -> None:
        self._line(None)

    def _line(self, text: str | None, status: str = "") -> None:
        if self._status:  # wipe the count before the line takes its place
            self._stream.write("\r\x1b[K")
        if text is not None:
            self._stream.write(text + "\n")
        self._status = status if self._terminal else ""
        self._stream.write(self._status)
        self._stream.flush()


# A fallback reason may quote a whole PyPTO error; the report and inspect keep it whole.
REASON_CHARS = 240
# A region may hold hundreds of ops; a line names this many and counts the rest.
OPS_SHOWN = 4


def kernel_line(done: int, total: int, region, kernel) -> str:
    """``[12/40] region_7 Slice+Pad+Tile: compiled 1.9 s (tile 1x8x64x128; budget 65536 B)``,
    ``... cache hit`` or ``... fell back: REASON``, with the model's strings made printable."""
    ops = op_types_text([op.op_type for op in region.original])
    if not kernel.compiled:
        reason = short_reason(kernel.fallback_reason or "no reason recorded")
        outcome = f"fell back{' (cached)' if kernel.from_cache else ''}: {reason}"
    elif kernel.from_cache:
        outcome = "cache hit"
    else:
        outcome = f"compiled {kernel.compile_seconds:.1f} s ({tile_text(kernel)})"
    return f"[{done}/{total}] {printable(region.id)} {printable(ops)}: {outcome}"


def op_types_text(op_types: list[str]) -> str:
    """A region's op types on one line: ``Relu+Neg+Sigmoid`` whole up to ``OPS_SHOWN`` ops, past
    that the first few and the count, ``Add+Mul+Relu+… (240 ops)``; the JSON summary and the
    report keep the whole list."""
    if len(op_types) <= OPS_SHOWN:
        return "+".join(op_types)
    return "+".join(op_types[:OPS_SHOWN - 1]) + f"+… ({len(op_types)} ops)"


def short_reason(reason: str) -> str:
    """A fallback reason made printable and cut to ``REASON_CHARS`` for one line of stderr."""
    reason = printable(reason)
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 1] + "…"


def tile_text(kernel) -> str:
    """The tuned tile as the kernel record has it: its budget, and the tile shapes its source
    sets (the record keeps no shape; the source is the one the blob ships)."""
    from pypto_offline.report.content import tile_shapes

    shapes = list(dict.fromkeys("x".join(part.strip() for part in shape.strip("()").split(","))
                                for _, shape in tile_shapes(kernel.source)))
    budget = f"budget {kernel.tuned_tile.budget_bytes} B" if kernel.tuned_tile else ""
    if not shapes:
        return f"tile {budget}" if budget else "tile not recorded"
    named = ", ".join(shapes[:3]) + (", …" if len(shapes) > 3 else "")
    return f"tile{'s' if len(shapes) > 1 else ''} {named}" + (f"; {budget}" if budget else "")


@contextmanager
def progress_on_stderr(quiet: bool):
    """The build's progress on stderr (nothing with --quiet; stdout stays the summary's, so
    --json output is clean); the terminal's running count is wiped however the build ends."""
    if quiet:
        yield SILENT
        return
    progress = StderrProgress(sys.stderr)
    try:
        yield progress
    finally:
        progress.close()


def print_fallbacks(build, kernels: list[dict]) -> None:
    """--fail-on-fallback's failures (those of the summary's kernels, every gear's, that fell
    back), on stderr whatever --quiet says: they are why the build failed. A blob of gears names
    each one's gear."""
    fell_back = [k for k in kernels if k["status"] == "fell_back"]
    geared = any(kernel["gear"] for kernel in kernels)
    for kernel in fell_back:
        ops = printable(op_types_text(kernel["ops"]))
        print(f"pypto-offline: fell back: {gear_label(kernel) if geared else ''}"
              f"{printable(kernel['id'])} {ops}: "
              f"{short_reason(kernel['fallback_reason'])}", file=sys.stderr)
    print(f"pypto-offline: --fail-on-fallback: {printable(build.model)} for {build.target}: "
          f"{len(fell_back)} of {len(kernels)} planned regions fell back (the blob and report are "
          f"written)", file=sys.stderr)


def human_summary(s: dict) -> str:
    from pypto_offline.offline_compiler.summary import precision_line

    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    lines = [
        f"{s['model']} → {s.get('blob', '')} ({s['target']})",
        *platform_text(s),
        f"  precision: {printable(precision_line(s))}",
        f"  nodes {s['nodes_before']} → {s['nodes_after']}; kernels {s['kernels_before']} → "
        f"{s['kernels_after']} ({s['fused_kernels']} fused kernels of {s['ops_fused']} ops)",
        f"  global memory {mb(s['gm_bytes_before'])} → {mb(s['gm_bytes_after'])} measured "
        f"(lower bound {mb(s['gm_bytes_lower_bound'])})",
        f"  estimated time {s['est_time_us_before']:.1f} → {s['est_time_us_after']:.1f} µs "
        f"(target bandwidth and launch cost are estimates)",
        f"  PyPTO: {s['pypto']['compiled']} kernels compiled, {s['pypto']['fell_back']} fell "
        f"back; {cost_model_text(s['pypto'])}",
        *verification_text(s),
        *gears_text(s),
    ]
    if "compile_seconds" in s:
        lines.append(f"  compiled in {s['compile_seconds']:.1f} s" + timings_text(s))
    if s.get("report"):
        lines.append(f"  report: {s['report']}")
    return "\n".join(lines)


def gears_text(s: dict) -> list[str]:
    """A blob of gears: each gear's inputs, kernels (those an earlier gear stores) and check;
    the lines above are the first gear's (docs/gears.md)."""
    if len(s["gears"]) < 2:
        return []
    from pypto_offline.offline_compiler.gears import shapes_text

    lines = [f"  {len(s['gears'])} gears (the graph's figures above: gear 0's; PyPTO's counts "
             f"and the verification: every gear's):"]
    for gear in s["gears"]:
        inputs = shapes_text(gear["inputs"])
        fell_back = f", {gear['fell_back']} fell back" if gear["fell_back"] else ""
        lines.append(f"    gear {gear['index']}: {printable(inputs)} — {gear['kernels_after']} "
                     f"kernels ({gear['kernels_referenced']} shared with an earlier gear"
                     f"{fell_back}), GM {gear['gm_bytes_after'] / 1e6:.2f} MB, verification "
                     f"{gear['verification']['status']}")
    return lines


def inspect_gear_text(s: dict, gear_count: int) -> list[str]:
    """``inspect --gear N``: which gear the figures are (every one of them its own)."""
    if s["gear"] is None:
        return []
    from pypto_offline.offline_compiler.gears import shapes_text

    inputs = shapes_text(s["gears"][0]["inputs"])
    return [f"  gear {s['gear']} of {gear_count}: {printable(inputs)}"]


def gear_label(kernel: dict) -> str:
    """``gear 1: ``, before a kernel of a blob of gears (its ids repeat from gear to gear)."""
    return f"gear {kernel['gear']}: "


def kernel_lines(kernels: list[dict], geared: bool) -> list[str]:
    """``inspect``'s kernel list: each kernel's ops and PyPTO times, or why it fell back; in a
    blob of gears, every gear's, each named by its gear."""
    from pypto_offline.offline_compiler.summary import shown

    return [f"    {gear_label(k) if geared else ''}{k['id']}: {op_types_text(k['ops'])} — "
            + (f"{shown(k['tuned_us'], '.2f', ' µs')} tuned, "
               f"{shown(k['default_us'], '.2f', ' µs')} default"
               if k["status"] == "compiled" else f"fell back: {k['fallback_reason']}")
            for k in kernels]


def platform_text(s: dict) -> list[str]:
    """What the kernels compiled under (docs/platform.md), and with --compare-platform what that
    changed against PyPTO's 910B platform."""
    platform, compared = s.get("platform"), s.get("platform_comparison")
    lines = [f"  compiled under: {printable(platform['description'])}"] if platform else []
    if compared:
        lines.append(f"  against PyPTO's 910B platform: tiles changed on "
                     f"{compared['tiles_changed']} of {compared['kernels_compared']} kernels; "
                     f"PyPTO {compared['pypto_us']:.1f} µs here, {compared['pypto_us_910b']:.1f}"
                     f" µs there")
    return lines


def verification_text(s: dict) -> list[str]:
    """What was checked now (onnxruntime; with ``verify``, the kernel sources derived again),
    apart from what the blob records of its build (PyPTO's pass-verify of each kernel)."""
    from pypto_offline.offline_compiler.summary import shown

    check, record = s["verification"], s["build_record"]
    if len(s["gears"]) > 1 and (check["gear"] or check["failed_gears"]):
        # the worst gear's check is the build's (docs/gears.md)
        failed = check["failed_gears"]
        check = {**check, "status": f"{check['status']} (" + (
            f"gear{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed; "
            if failed else "") + f"gear {check['gear']}'s check below)"}
    onnxruntime = ("onnxruntime not run" if check["onnxruntime"] == "skipped" else
                   f"onnxruntime {check['onnxruntime']}, max abs diff "
                   f"{shown(check['max_abs_diff'], '.2e')}")
    recorded = (f"the build's record, not re-run: PyPTO pass-verify passed "
                f"{record['kernels_passed']}/{record['kernels_checked']} kernels")
    sources = check["kernel_sources"]
    precision = precision_text(check)
    if sources is None:
        return [f"  verification: {check['status']} ({onnxruntime}); {recorded}", *precision]
    fell_back = (f"; {len(sources['fell_back'])} fell back (their ops run unfused: no source to "
                 f"check)" if sources["fell_back"] else "")
    return [f"  verification: {check['status']}",
            f"    checked now: {onnxruntime}; kernel sources derived again: "
            f"{sources['matching']}/{sources['compiled']} match{fell_back}",
            *(f"    {d['id']}: {d['reason']}" for d in sources["differing"]),
            f"    {recorded}", *precision]


def precision_text(check: dict) -> list[str]:
    """A converted build against the original model (docs/precision.md): its least similar
    output and kernel, the kernels beyond the thresholds and, when it failed, the weights
    saturated to fp16's range with the kernel that reads each."""
    thresholds = check["thresholds"]
    if thresholds is None:
        return []
    worst = check["worst_output"]
    metrics = check["metrics"][worst] if worst else {}
    beyond = check["kernels_beyond_thresholds"]
    bound = (f", relative distance at most {thresholds['max_rel_distance']}"
             if "max_rel_distance" in thresholds else "")
    measured = (f" (cosine {metrics['cosine']:.6f}"
                + (f", relative distance {metrics['rel_distance']:.3g}"
                   if "rel_distance" in metrics else "") + ")") if metrics else ""
    return [f"    against the original model (cosine at least {thresholds['min_cosine']}{bound}):"
            f" least similar output {printable(worst)}{measured}, least similar kernel "
            f"{check['worst_kernel']}" + (f"; kernels beyond: {', '.join(beyond)}" if beyond
                                          else ""),
            *map(saturated_text, check["saturated_weights"])]


def saturated_text(weight: dict) -> str:
    """A weight the conversion saturated, in a failed check: what a scale error comes from."""
    where = f" in {weight['kernel']}" if weight["kernel"] else ", unfused"
    return (f"    weight saturated to fp16's range: {printable(weight['tensor'])} (largest "
            f"{weight['largest']:.6g}, clamped to ±65504; read by "
            f"{printable(weight['node'])}{where})")


def timings_text(s: dict) -> str:
    """``: import 0.4, plan 0.1, ... s; kernels 1 compiled by PyPTO, 2 cache hits``: the JSON
    summary's ``timings`` and ``kernel_cache``, on the line of the total."""
    if "timings" not in s:
        return ""
    stages = ", ".join(f"{name.removesuffix('_s')} {seconds:.1f}"
                       for name, seconds in s["timings"].items())
    cache = s.get("kernel_cache")
    counts = (f"; kernels {cache['compiled']} compiled by PyPTO, {cache['hits']} cache hits; "
              f"{cache['pypto_compiles']} PyPTO compiles") if cache else ""
    return f": {stages} s{counts}"


def cost_model_text(pypto: dict) -> str:
    """PyPTO's fused against unfused time, saying which kernels it covers; "not measured" when
    no kernel's unfused baseline compiled (a sum of nothing is not 0 µs)."""
    if pypto["cost_us_fused"] is None or pypto["cost_us_unfused"] is None:
        return "cost model not measured (no kernel's unfused baseline compiled)"
    compared = pypto.get("kernels_cost_compared", 0)
    over = f" over {compared} of {pypto['compiled']} kernels" \
        if 0 < compared < pypto["compiled"] else ""
    return (f"cost model {pypto['cost_us_fused']:.1f} µs fused against "
            f"{pypto['cost_us_unfused']:.1f} µs unfused ({pypto['cost_us_unfused_basis']}){over}")


def print_summary(summary: dict, args, human) -> None:
    """The one way a summary reaches stdout: JSON escapes control characters itself; the human
    form gets every string of the summary escaped first (a model's names are its author's)."""
    if args.json:  # one object a line (JSON Lines): a batch prints one per build
        print(json.dumps(summary, sort_keys=True), flush=True)
    elif not args.quiet:
        print(human(printable(summary)), flush=True)


def printable(value):
    """``value`` with every non-printable character of its strings written as Python writes it
    (``\\x1b``, ``\\n``, ``\\u202e``), through dicts and lists: a node named "\\x1b[2J" must not
    clear the user's terminal, nor a newline forge a line of the summary."""
    if isinstance(value, str):
        return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                       for c in value)
    if isinstance(value, dict):
        return {key: printable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(item) for item in value]
    return value


def human_cache_info(info: dict) -> str:
    kinds = ", ".join(f"{kind} {count}" for kind, count in info["entries_by_kind"].items())
    return "\n".join([
        f"{info['folder']}" + ("" if info["exists"] else " (does not exist yet)"),
        f"  entries: {info['entries']}" + (f" ({kinds})" if kinds else ""),
        f"  size: {info['total_bytes']} bytes ({mib(info['total_bytes'])}; entries "
        f"{info['entry_bytes']} bytes)"])


def human_cache_clean(result: dict) -> str:
    removed, left = result["removed"], result["left"]
    return (f"removed {removed['entries']} entries, {removed['bytes']} bytes "
            f"({mib(removed['bytes'])}), from {result['folder']}; left: {left['entries']} "
            f"entries, {left['total_bytes']} bytes ({mib(left['total_bytes'])})")


def mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"

