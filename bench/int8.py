"""Corpus models quantised as a phone pipeline would, built as int8 (issue 52).

    python -m bench.int8 [--models ppocr_cls_v2,...] [--target kirin9050] [--name int8]
                         [--qdq-dir DIR] [--cache-dir DIR] [--out bench/results/int8] [--table]
                         [--uint8-activations]

Each model is quantised with onnxruntime's ``quantize_static`` as its documentation says a user
should: ``quant_pre_process`` first (onnx's shape inference, basic graph optimisation), then QDQ
format, per-channel int8 weights (the model converted to opset 13 first when older: per-channel
DequantizeLinear needs it), int8 activations (uint8 with ``--uint8-activations``), MinMax
calibration on ``CALIBRATION`` seeded random batches made from the corpus's InputSpec (seeds
1..N: the measured inputs, seed 0, are not among them). The QDQ model is cached in
``--qdq-dir`` (the same bytes for the same onnxruntime).

Then the fp32 corpus model and its QDQ model are built for the target with verification, both on
the same inputs (the corpus's, seed 0), and ``NAME.json`` / ``NAME.md`` get one row per model
(written after each: an interrupted run keeps what it built): kernels, GM bytes after fusion and
the modelled time (``est_time_us_after``) of each build, their int8/fp32 ratios, the int8
build's verification against onnxruntime on the QDQ model, and the QDQ model's own accuracy
against the fp32 model (both in onnxruntime, same inputs). Issue 52's target: GM bytes ≤ 0.4x
the fp32 build's with no more kernels. Not part of the test run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench import corpus  # noqa: E402
from bench.compare import run_plain, static_model  # noqa: E402
from bench.fallbacks import commit  # noqa: E402

OUT = Path(__file__).resolve().with_name("results") / "int8"
# Two CNNs and two transformers of the corpus
MODELS = ("ppocr_cls_v2", "nudenet_yolov8n_320", "tf_bert_encoder", "tf_vit")
CALIBRATION = 8
PER_CHANNEL_OPSET = 13  # DequantizeLinear's axis
GM_TARGET = 0.4
INTEGER_OPS = {"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}


def qdq_path(name: str, folder: Path, uint8_activations: bool = False) -> Path:
    """The corpus model quantised (``quantise``), made once into ``folder``."""
    target = folder / f"{name}{'.uint8' if uint8_activations else ''}.qdq.onnx"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    calibration = [corpus.MODELS[name].make_inputs(seed) for seed in range(1, CALIBRATION + 1)]
    quantised = quantise(at_least_opset(static_model(name), PER_CHANNEL_OPSET), calibration,
                         uint8_activations=uint8_activations)
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".onnx", delete=False) as staged:
        staged.write(quantised.SerializeToString())
    os.replace(staged.name, target)  # never a torn model in the cache
    return target


def quantise(model, calibration: list[dict], prepare: bool = True, qoperator: bool = False,
             uint8_activations: bool = False):
    """``model`` (static shapes) through onnxruntime's ``quantize_static`` as its documentation
    tells a user to: ``quant_pre_process`` first (``prepare``), QDQ format (QOperator with
    ``qoperator``: QLinearConv, QLinearMatMul), per-channel int8 weights, int8 activations
    (uint8 with ``uint8_activations``, quantize_static's default), MinMax on the
    ``calibration`` feeds. The same bytes for the same model, feeds and onnxruntime
    (tests/qdq_models.py makes its unit models with it too)."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="quantise-") as tmp:
        source, prepared, staged = (Path(tmp) / f for f in ("in.onnx", "pre.onnx", "q.onnx"))
        source.write_bytes(model.SerializeToString())
        if prepare:
            # the shapes are static already; onnxruntime's symbolic pass would add nothing and
            # asserts on a Concat of ppocr_cls_v2 (axis != 0), so onnx's shape inference alone
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        else:
            prepared = source
        quantize_static(str(prepared), str(staged), CalibrationReader(calibration),
                        quant_format=QuantFormat.QOperator if qoperator else QuantFormat.QDQ,
                        per_channel=True,
                        activation_type=QuantType.QUInt8 if uint8_activations
                        else QuantType.QInt8, weight_type=QuantType.QInt8)
        return onnx.load(staged)


def at_least_opset(model, opset: int):
    """``model`` converted to ``opset`` when its default domain's is older. quantize_static
    writes per-channel DequantizeLinear (its ``axis``, opset 13) into an opset 11 model
    (ppocr_cls_v2) without converting it: a model onnxruntime then refuses."""
    import onnx.version_converter

    current = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    return model if current >= opset else onnx.version_converter.convert_version(model, opset)


class CalibrationReader:
    """onnxruntime's CalibrationDataReader protocol: ``get_next`` gives the feed dicts one at a
    time, then None."""

    def __init__(self, feeds: list[dict]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def build(path: Path, name: str, target: str, cache_dir: Path, feeds: dict) -> dict:
    """The figures of one verified build (or the error that stopped it)."""
    import pypto_offline
    from pypto_offline.errors import PyptoOfflineError

    try:
        compiled = pypto_offline.compile(path, target, corpus.MODELS[name].input_shapes,
                                         cache_dir=cache_dir, verify=True, inputs=feeds)
    except PyptoOfflineError as error:
        return {"error": str(error)}
    s = compiled.summary()
    check = s["verification"]
    return {"kernels_after": s["kernels_after"], "gm_bytes_after": s["gm_bytes_after"],
            "est_time_us_after": s["est_time_us_after"],
            "compiled": s["pypto"]["compiled"],
            "fell_back": sum(k["status"] == "fell_back" for k in s["kernels"]),
            # the kernels holding an integer contraction (docs/int8.md)
            "integer_kernels": sum(bool(INTEGER_OPS & set(k["ops"])) for k in s["kernels"]),
            "verification": check["status"], "outputs": check["metrics"],
            "kernels_beyond": check.get("kernels_beyond_thresholds", [])}


def qdq_accuracy(name: str, qdq: Path, feeds: dict) -> dict:
    """Each output of the QDQ model against the fp32 model's, both in onnxruntime."""
    import onnx

    from pypto_offline.runtime import precision_metrics

    fp32 = static_model(name)
    want = run_plain(fp32, feeds)
    got = run_plain(onnx.load(qdq), feeds)
    return {output.name: precision_metrics(w, g)
            for output, w, g in zip(fp32.graph.output, want, got)}


def measure(name: str, target: str, qdq_dir: Path, cache_dir: Path,
            uint8_activations: bool = False) -> dict:
    import onnx

    qdq = qdq_path(name, qdq_dir, uint8_activations)
    graph = onnx.load(qdq).graph
    feeds = corpus.MODELS[name].make_inputs(seed=0)
    row = {"model": name, "target": target, "commit": commit(), "qdq_model": str(qdq),
           "activations": "uint8" if uint8_activations else "int8",
           "qdq_bytes": qdq.stat().st_size,
           "qdq_nodes": {op: sum(n.op_type == op for n in graph.node)
                         for op in ("QuantizeLinear", "DequantizeLinear")},
           "fp32": build(corpus.model_path(name), name, target, cache_dir, feeds),
           "int8": build(qdq, name, target, cache_dir, feeds),
           "qdq_vs_fp32": qdq_accuracy(name, qdq, feeds)}
    fp32, int8 = row["fp32"], row["int8"]
    if "error" not in fp32 and "error" not in int8:
        row["ratio"] = {key: round(int8[key] / fp32[key], 3) if fp32[key] else None
                        for key in ("kernels_after", "gm_bytes_after", "est_time_us_after")}
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | kernels int8 (fp32) | ratio | int8 kernels with an integer contraction "
             "| GM bytes int8 (fp32) | ratio | modelled µs int8 (fp32) | verification int8 vs "
             "QDQ in onnxruntime (least cosine, max abs; kernels beyond) | QDQ vs fp32 in "
             "onnxruntime (least cosine, max abs) | fp32 verification | target "
             f"(GM ≤ {GM_TARGET}x, kernels ≤ fp32) |", "|---" * 11 + "|"]
    for r in rows:
        fp32, int8 = r["fp32"], r["int8"]
        accuracy = _least(r["qdq_vs_fp32"])
        if "error" in fp32 or "error" in int8:
            error = int8.get("error") or fp32.get("error")
            lines.append(f"| {r['model']} | error: {error[:100]} | | | | | | | {accuracy} | "
                         "| |")
            continue
        ratio = r["ratio"]
        met = ratio["gm_bytes_after"] <= GM_TARGET and int8["kernels_after"] <= fp32[
            "kernels_after"]
        lines.append(
            f"| {r['model']} | {int8['kernels_after']} ({fp32['kernels_after']}) | "
            f"{ratio['kernels_after']:.2f} | {int8.get('integer_kernels', '—')} | "
            f"{int8['gm_bytes_after']:,} "
            f"({fp32['gm_bytes_after']:,}) | {ratio['gm_bytes_after']:.2f} | "
            f"{int8['est_time_us_after']:.1f} ({fp32['est_time_us_after']:.1f}) | "
            f"{int8['verification']} ({_least(int8['outputs'])}; "
            f"{len(int8.get('kernels_beyond', []))}) | {accuracy} | "
            f"{fp32['verification']} | {'met' if met else 'missed'} |")
    return "\n".join(lines) + "\n"


def _least(metrics: dict) -> str:
    """The least cosine and the largest absolute difference over a build's outputs."""
    if not metrics:
        return "—"
    cosine = min(m["cosine"] for m in metrics.values())
    return f"{cosine:.6f}, {max(m['max_abs'] for m in metrics.values()):.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--target", default="kirin9050")
    parser.add_argument("--name", default="int8", help="the results' file names")
    parser.add_argument("--qdq-dir", type=Path,
                        default=Path.home() / ".cache" / "pypto-offline" / "int8")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the kernel cache (default: the user's, warm for the fp32 corpus)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--uint8-activations", action="store_true",
                        help="quantise activations to uint8 (quantize_static's default)")
    parser.add_argument("--table", action="store_true",
                        help="only write NAME.md again from NAME.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    if args.table:
        (args.out / f"{args.name}.md").write_text(table(rows))
        return 0
    for name in args.models.split(","):
        row = measure(name, args.target, args.qdq_dir, args.cache_dir, args.uint8_activations)
        rows = [r for r in rows if r["model"] != name] + [row]
        path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        (args.out / f"{args.name}.md").write_text(table(rows))
        print(f"{name}: fp32 {row['fp32'].get('error') or row['fp32']['verification']}, int8 "
              f"{row['int8'].get('error') or row['int8']['verification']}", file=sys.stderr,
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
