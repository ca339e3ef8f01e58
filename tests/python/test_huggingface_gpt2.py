"""riftco_transformer.interchange.huggingface_gpt2: GPT2LMHeadModel directories on our decoder.

The checkpoints are written under Hugging Face's names and layout (Conv1D weights stored
[in, out], the fused c_attn) by the ``safetensors`` package in the oracle interpreter, which
also computes GPT-2's logits with its own numpy forward in float64 (tanh GELU written as
the paper gives it, tied head h·Eᵀ): ours must match at every position. The error rules use
files built here byte by byte, so they run without the oracle.
"""

from __future__ import annotations

import json
import random
import subprocess
from array import array
from pathlib import Path

import pytest

from riftco_transformer import DecoderOnlyTransformer, load_pretrained
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.interchange.huggingface import load_huggingface, read_config
from support import oracle_python
from test_huggingface_import import safetensors_bytes, write_tokenizer

CONFIG = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_embd": 16,
    "n_head": 4,
    "n_layer": 2,
    "n_positions": 12,
    "n_inner": None,
    "vocab_size": 258,
    "layer_norm_epsilon": 1e-5,
    "bos_token_id": 257,
    "eos_token_id": 257,
    "scale_attn_weights": True,
    "tie_word_embeddings": True,
}
TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 257]


def gpt2_shapes(config: dict, prefix: str = "transformer.") -> dict[str, list[int]]:
    """Every tensor of a GPT2LMHeadModel checkpoint, HF name -> shape (Conv1D: [in, out])."""
    d, v, c = config["n_embd"], config["vocab_size"], config["n_positions"]
    f = config.get("n_inner") or 4 * d
    shapes = {f"{prefix}wte.weight": [v, d], f"{prefix}wpe.weight": [c, d]}
    for block in range(config["n_layer"]):
        p = f"{prefix}h.{block}."
        shapes.update({
            p + "ln_1.weight": [d], p + "ln_1.bias": [d],
            p + "attn.c_attn.weight": [d, 3 * d], p + "attn.c_attn.bias": [3 * d],
            p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
            p + "ln_2.weight": [d], p + "ln_2.bias": [d],
            p + "mlp.c_fc.weight": [d, f], p + "mlp.c_fc.bias": [f],
            p + "mlp.c_proj.weight": [f, d], p + "mlp.c_proj.bias": [d],
        })
    shapes[f"{prefix}ln_f.weight"] = [d]
    shapes[f"{prefix}ln_f.bias"] = [d]
    if not config.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = [v, d]
    return shapes


ORACLE = r"""
import json, sys
import numpy as np
import safetensors

spec = json.loads(sys.argv[1])
config, prefix = spec["config"], spec["prefix"]
rng = np.random.default_rng(spec["seed"])
stored, values = {}, {}
for name, shape in spec["shapes"].items():
    if len(shape) == 1 and (".ln_" in name or name.startswith(prefix + "ln_")):
        v = (1.0 + rng.uniform(-0.3, 0.3, shape)) if name.endswith("weight") else \
            rng.uniform(-0.2, 0.2, shape)
    else:
        v = rng.standard_normal(shape) * 0.3
    v = v.astype(np.float32)
    if spec["dtype"] == "F32":
        stored[name] = ("float32", v)
        values[name] = v.astype(np.float64)
    elif spec["dtype"] == "F16":
        half = v.astype(np.float16)
        stored[name] = ("float16", half)
        values[name] = half.astype(np.float64)
    else:  # BF16: round to nearest even on the float32 bits
        bits = v.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        stored[name] = ("bfloat16", rounded)
        values[name] = (rounded.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
if spec["mask_buffers"]:  # the causal-mask buffers older checkpoints carry
    c = config["n_positions"]
    for block in range(config["n_layer"]):
        mask = np.tril(np.ones((c, c), dtype=np.float32)).reshape(1, 1, c, c)
        stored[f"{prefix}h.{block}.attn.bias"] = ("float32", mask)
        stored[f"{prefix}h.{block}.attn.masked_bias"] = ("float32", np.array(-1e4, np.float32))
if spec["head_copy"]:
    stored["lm_head.weight"] = stored[prefix + "wte.weight"]
specs = {name: safetensors.TensorSpec(dtype=dtype, shape=array.shape,
                                      data_ptr=array.ctypes.data, data_len=array.nbytes)
         for name, (dtype, array) in stored.items()}
safetensors.serialize_file(specs, spec["directory"] + "/model.safetensors",
                           metadata={"format": "pt"})

# GPT-2's forward in float64, from the Hugging Face names.
W = lambda name: values[prefix + name]
d, heads = config["n_embd"], config["n_head"]
hd = d // heads
eps = config["layer_norm_epsilon"]

def layer_norm(x, name):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * W(name + ".weight") + W(name + ".bias")

def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

tokens = spec["tokens"]
T = len(tokens)
h = W("wte.weight")[tokens] + W("wpe.weight")[:T]
for block in range(config["n_layer"]):
    p = f"h.{block}."
    a = layer_norm(h, p + "ln_1")
    qkv = a @ W(p + "attn.c_attn.weight") + W(p + "attn.c_attn.bias")  # Conv1D: x·W + b
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(T, heads, hd).transpose(1, 0, 2)
               for i in range(3))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    mixed = (scores @ v).transpose(1, 0, 2).reshape(T, d)
    h = h + mixed @ W(p + "attn.c_proj.weight") + W(p + "attn.c_proj.bias")
    m = layer_norm(h, p + "ln_2")
    hidden = gelu_new(m @ W(p + "mlp.c_fc.weight") + W(p + "mlp.c_fc.bias"))
    h = h + hidden @ W(p + "mlp.c_proj.weight") + W(p + "mlp.c_proj.bias")
h = layer_norm(h, "ln_f")
head = values["lm_head.weight"] if "lm_head.weight" in values else W("wte.weight")
print(json.dumps((h @ head.T).ravel().tolist()))
"""


def oracle_checkpoint(directory: Path, *, dtype="F32", prefix="transformer.", seed=3,
                      mask_buffers=False, head_copy=False, tokens=TOKENS, **changes) -> list:
    """A GPT-2 checkpoint written by the safetensors package; returns the oracle's logits
    [T·V] of ``tokens``."""
    python = oracle_python("safetensors")
    directory.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, **changes}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    write_tokenizer(directory, settings={})
    spec = {"directory": str(directory), "config": config, "prefix": prefix, "dtype": dtype,
            "seed": seed, "mask_buffers": mask_buffers, "head_copy": head_copy,
            "tokens": tokens, "shapes": gpt2_shapes(config, prefix)}
    completed = subprocess.run([python, "-c", ORACLE, json.dumps(spec)], capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def logits_of(model, tokens=TOKENS) -> array:
    with model(tokens) as variable:
        return variable.to_array()


def worst_difference(actual, expected) -> float:
    assert len(actual) == len(expected)
    return max(abs(a - b) for a, b in zip(actual, expected))


@pytest.mark.parametrize(
    ("dtype", "prefix", "changes"),
    [
        ("F32", "transformer.", {}),
        ("F16", "", {}),
        ("BF16", "transformer.", {"n_inner": 24}),
        ("F32", "", {"tie_word_embeddings": False}),
        ("F32", "transformer.", {"activation_function": "gelu_pytorch_tanh"}),
    ],
)
def test_logits_match_the_numpy_oracle_at_every_position(tmp_path, dtype, prefix, changes):
    expected = oracle_checkpoint(tmp_path, dtype=dtype, prefix=prefix, **changes)
    with load_huggingface(tmp_path) as loaded:
        assert loaded.architecture == "gpt"
        assert isinstance(loaded.model, DecoderOnlyTransformer)
        config = loaded.model.config
        assert config.feed_forward_activation == "gelu_tanh"
        assert config.tie_embeddings == changes.get("tie_word_embeddings", True)
        assert worst_difference(logits_of(loaded.model), expected) < 1e-4


def test_mask_buffers_and_a_tied_head_copy_are_accepted(tmp_path):
    expected = oracle_checkpoint(tmp_path, mask_buffers=True, head_copy=True)
    with load_huggingface(tmp_path) as loaded:
        assert worst_difference(logits_of(loaded.model), expected) < 1e-4


def test_the_exact_gelu_checkpoint_is_not_the_tanh_one(tmp_path):
    """activation_function "gelu" is erf GELU: same weights, logits that differ from the
    tanh oracle by more than the tolerance (so the activation option is really used)."""
    expected = oracle_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["activation_function"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with load_huggingface(tmp_path) as loaded:
        assert loaded.model.config.feed_forward_activation == "gelu"
        assert worst_difference(logits_of(loaded.model), expected) > 1e-4


def test_a_shorter_context_keeps_the_first_position_rows(tmp_path):
    expected = oracle_checkpoint(tmp_path, tokens=TOKENS[:6])
    with load_pretrained(tmp_path, maximum_context=6) as loaded:
        assert loaded.model.maximum_context == 6
        assert worst_difference(logits_of(loaded.model, TOKENS[:6]), expected) < 1e-4
    with load_pretrained(tmp_path) as loaded:  # default: n_positions
        assert loaded.model.maximum_context == CONFIG["n_positions"]
    with pytest.raises(ValueError, match="maximum_context 13 exceeds n_positions 12"):
        load_pretrained(tmp_path, maximum_context=13)


def test_saved_bundle_reopens_with_the_same_logits_generation_and_config(tmp_path):
    expected = oracle_checkpoint(tmp_path / "hf")
    bundle_path = tmp_path / "gpt2.rift"
    with load_pretrained(tmp_path / "hf") as loaded:
        greedy = loaded.generate("Hello", max_new_tokens=5, temperature=0.0).token_ids
        loaded.save(bundle_path)
    bundle = ModelBundle.load(bundle_path)
    assert bundle.architecture == "gpt"
    assert bundle._manifest["config"]["feed_forward_activation"] == "gelu_tanh"
    assert bundle._manifest["config"]["tie_embeddings"] is True
    assert all("language_model_head" not in spec.name for spec in bundle._parameters)
    with load_pretrained(bundle_path) as reopened:
        assert reopened.model.config == read_config(tmp_path / "hf")
        assert worst_difference(logits_of(reopened.model), expected) < 1e-4
        assert reopened.generate("Hello", max_new_tokens=5, temperature=0.0).token_ids == greedy


# ---- the rules (files built here, no oracle)


def hand_built(directory: Path, *, drop=(), reshape=None, extra=None, **changes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, **changes}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    write_tokenizer(directory, settings={})
    generator = random.Random(5)
    tensors = {}
    for name, shape in gpt2_shapes(CONFIG).items():
        if name in drop:
            continue
        shape = (reshape or {}).get(name, shape)
        count = 1
        for dimension in shape:
            count *= dimension
        tensors[name] = ("F32", shape,
                         array("f", [generator.gauss(0, 0.3) for _ in range(count)]).tobytes())
    tensors.update(extra or {})
    (directory / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    return directory


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"activation_function": "swish"}, "activation_function 'swish' is not supported"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx true"),
        ({"scale_attn_weights": False}, "scale_attn_weights false is not supported"),
        ({"add_cross_attention": True}, "add_cross_attention true is not supported"),
        ({"n_head": 3}, "n_embd 16 is not a multiple of n_head 3"),
        ({"n_embd": None}, "n_embd is missing"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ],
)
def test_unsupported_config_is_rejected_naming_the_key(tmp_path, changes, fragment):
    hand_built(tmp_path, **changes)
    with pytest.raises(ValueError) as caught:
        load_huggingface(tmp_path)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (dict(drop=("transformer.h.1.mlp.c_fc.bias",)),
         "no tensor 'h.1.mlp.c_fc.bias'"),
        (dict(reshape={"transformer.h.0.attn.c_attn.weight": [48, 16]}),
         "tensor 'transformer.h.0.attn.c_attn.weight' has shape [48, 16], the config needs "
         "[16, 48]"),
        (dict(reshape={"transformer.wpe.weight": [13, 16]}),
         "tensor 'transformer.wpe.weight' has shape [13, 16]"),
        (dict(extra={"transformer.h.0.attn.rotary": ("F32", [2], bytes(8))}),
         "unexpected tensor 'transformer.h.0.attn.rotary'"),
        (dict(extra={"lm_head.weight": ("F32", [258, 16], bytes(258 * 16 * 4))}),
         "differs from"),
        (dict(extra={"wte.weight": ("F32", [258, 16], bytes(258 * 16 * 4))}),
         "appears with and without"),
    ],
)
def test_checkpoint_faults_are_rejected_and_nothing_stays_open(tmp_path, monkeypatch, build,
                                                               fragment):
    from riftco_transformer.interchange import huggingface_gpt2

    created = []

    class Recording(DecoderOnlyTransformer):
        def __init__(self, *arguments, **keywords):
            super().__init__(*arguments, **keywords)
            created.append(self)

    monkeypatch.setattr(huggingface_gpt2, "DecoderOnlyTransformer", Recording)
    hand_built(tmp_path, **build)
    with pytest.raises(ValueError) as caught:
        load_huggingface(tmp_path)
    assert fragment in str(caught.value), str(caught.value)
    assert all(model.closed for model in created)
