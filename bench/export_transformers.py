"""Export the transformers architectures of the corpus (``bench.corpus``) to ONNX (needs the
``corpus`` extra).

Tiny configs, weights from ``torch.manual_seed(0)``, ``torch.onnx.export(..., dynamo=True)`` at
opset 18 with static shapes and eager attention. The wrapper is put in eval mode itself (else
dropout comes back); KV-cache models build their ``DynamicCache`` inside the wrapper from explicit
past key/value inputs. The stack traces with local paths that the exporter writes into node
metadata are stripped, so that exports are reproducible. Each export is checked against PyTorch in
onnxruntime before it is cached.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

TOLERANCE = 1e-4
SEQ, PAST = 4, 12


# The past lengths a decoder exported with a dynamic past takes (bench.gears: 16 to 128), and
# the positions its config must then hold (the past and the new tokens)
MAX_PAST = 252
DYNAMIC_PAST_POSITIONS = 256


def _configs(positions: int = 64):
    import transformers as tf

    return {
        "tf_llama_decoder_kv": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
            attn_implementation="eager")),
        "tf_gpt2_decoder_kv": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=positions,
            bos_token_id=0, eos_token_id=0, attn_implementation="eager")),
        "tf_bert_encoder": lambda: tf.BertModel(tf.BertConfig(
            vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, attn_implementation="eager"), add_pooling_layer=False),
        "tf_swin": lambda: tf.SwinModel(tf.SwinConfig(
            image_size=56, patch_size=4, embed_dim=32, depths=[2, 2, 2], num_heads=[2, 4, 8],
            window_size=4, attn_implementation="eager")),
        "tf_vit": lambda: tf.ViTModel(tf.ViTConfig(
            image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128, attn_implementation="eager"),
            add_pooling_layer=False),
        "tf_convnext": lambda: tf.ConvNextModel(tf.ConvNextConfig(
            image_size=32, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1])),
    }


def _wrap(name: str, model, torch):
    """A module whose forward takes the corpus inputs in order and returns plain tensors."""
    from transformers import DynamicCache

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(*inputs).last_hidden_state

    class DecoderWithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache(config=self.model.config)
            for layer in range(len(past) // 2):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=cache, use_cache=True)
            presents = []
            for layer in out.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    wrapper = DecoderWithCache() if name.endswith("_kv") else Encoder()
    return wrapper.eval()


def export_model(name: str, target: Path, dynamic_past: bool = False) -> None:
    """``dynamic_past``: a KV-cache decoder whose past length is a symbolic dimension ``past``
    (the mask's ``past + 4``), with positions for a past up to ``MAX_PAST``: the model gears
    are built from (bench.gears, docs/gears.md)."""
    import onnx_ir as ir
    import onnxruntime as ort
    import torch

    from bench.corpus import MODELS, CorpusError

    spec = MODELS[name]
    torch.manual_seed(0)
    model = _configs(DYNAMIC_PAST_POSITIONS if dynamic_past else 64)[name]().eval()
    wrapper = _wrap(name, model, torch)
    feeds = spec.make_inputs(seed=0)
    args = tuple(torch.from_numpy(feeds[key]) for key in spec.inputs)
    with torch.no_grad():
        expected = wrapper(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    program = torch.onnx.export(wrapper, args, dynamo=True, opset_version=18,
                                input_names=list(spec.inputs), verbose=False,
                                dynamic_shapes=_past_shapes(spec, torch) if dynamic_past
                                else None)
    proto = _strip_local_paths(program.model_proto, ir)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    for want, have in zip(expected, got):
        diff = float(np.max(np.abs(want.numpy() - have)))
        if diff > TOLERANCE:
            raise CorpusError(f"{name}: export differs from PyTorch by {diff}")
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(proto.SerializeToString())
    os.replace(tmp.name, target)


def _past_shapes(spec, torch) -> tuple:
    """torch.export's dynamic shapes of a decoder's inputs: the past keys' and values' length
    axis is ``past``, the mask's ``past`` plus the new tokens."""
    past = torch.export.Dim("past", min=2, max=MAX_PAST)
    return (None, {1: past + SEQ}, tuple({2: past} for _ in list(spec.inputs)[2:]))


def _strip_local_paths(proto, ir):
    model = ir.serde.deserialize_model(proto)
    ir.passes.common.ClearMetadataAndDocStringPass()(model)
    return ir.serde.serialize_model(model)
