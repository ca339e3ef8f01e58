"""GGUF export (interchange/gguf_export.py, issue 31): every rotary family's bundle written as
GGUF v3 and read back by our GGUF loader with the same config and logits, F16 as the F32 export
of the float16-rounded weights, the tokenizer and chat template kept, `riftco convert`, every
refusal leaving no file, and the file read by the `gguf` package (an independent reader) when
the oracle interpreter has it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from support import oracle_python
from test_decoder_families import DIMENSIONS, FAMILIES, byte_alphabet, forward_values, preset

from riftco_transformer import (
    DecoderOnlyTransformer,
    LlamaMistralConfig,
    LlamaMistralTransformer,
    PretrainedModel,
    Tokenizer,
    TransformerConfig,
    load_pretrained,
)
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.interchange import export_gguf
from riftco_transformer.interchange.gguf_export import gguf_read_back_config
from riftco_transformer.native.pretrained_tokenizer import (
    PretrainedTokenizer,
    gguf_metadata_string,
)
from riftco_transformer.serving.chat_templates import PretrainedChatTemplate

REPOSITORY = __import__("pathlib").Path(__file__).resolve().parents[2]
PROMPT = "One decoder for every family, past the window."
PREFIX = 24  # tokens of PROMPT used: past every window (4), within the context (32)
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def flat(rows):
    return [value for row in rows for value in (flat(row) if isinstance(row, list) else [row])]


def largest_difference(first, second):
    return max(abs(a - b) for a, b in zip(flat(first), flat(second), strict=True))


def capture(config, tokenizer=None, chat_template=None, weights=None):
    """A bundle of a random-weight model of ``config`` (``weights``: a function of the flat
    values and the parameter shapes giving the values to load instead)."""
    tokenizer = tokenizer or PretrainedTokenizer.from_vocabulary(byte_alphabet())
    with LlamaMistralTransformer(config) as model:
        if weights is not None:
            with model.parameters() as parameters:
                parameters.load_flat_values(weights(parameters.flat_values(), parameters.shapes))
        return ModelBundle.capture(model, tokenizer, "pretraining", chat_template=chat_template)


def bundle_logits(bundle, tokens):
    with bundle.instantiate() as runtime:
        return forward_values(runtime.model, tokens)


def gguf_logits(path, tokens):
    with load_pretrained(path, maximum_context=0) as loaded:
        return loaded.model.config, forward_values(loaded.model, tokens)


def directory_files(directory):
    return sorted(entry.name for entry in directory.iterdir())


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_every_family_reads_back_with_the_same_config_and_logits(tmp_path, architecture):
    config = preset(architecture)
    bundle = capture(config)
    tokens = PretrainedTokenizer.from_vocabulary(byte_alphabet()).encode(PROMPT)[:PREFIX]
    assert len(tokens) > (config.sliding_window or 0)
    expected = bundle_logits(bundle, tokens)
    path = export_gguf(bundle, tmp_path / f"{architecture}.gguf")
    assert directory_files(tmp_path) == [f"{architecture}.gguf"]  # no temporary file left
    read, logits = gguf_logits(path, tokens)
    assert read == gguf_read_back_config(config)
    # What differs is only what the file carries in another form (the module docstring).
    differences = {name for name in config.__dataclass_fields__
                   if getattr(read, name) != getattr(config, name)}
    allowed = {"random_seed", "rms_norm_epsilon"}  # no seed in GGUF; epsilon is float32
    if architecture == "mistral":
        allowed.add("architecture")  # llama.cpp's converter writes Mistral as llama
        assert read.architecture == "llama"
    if architecture.startswith("gemma"):
        allowed.add("norm_weight_offset")  # stored as 1 + w
        assert not read.norm_weight_offset
    if architecture == "qwen3" or architecture.startswith("gemma"):
        assert read.resolved_head_width == config.resolved_head_width == 6
    if config.rope_scaling == "llama3":  # written as rope_freqs.weight, the divisors
        allowed |= {"rope_scaling", "rope_frequency_factors", "rope_scaling_factor",
                    "rope_original_context"}
        assert read.rope_scaling == "frequency_factors"
        assert len(read.rope_frequency_factors) == config.resolved_head_width // 2
    assert differences <= allowed, differences
    assert read.sliding_window == config.sliding_window
    assert read.sliding_window_period == config.sliding_window_period
    assert largest_difference(logits, expected) <= 1e-5


@pytest.mark.parametrize("architecture, scaling", [
    ("qwen2", dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_context=8)),
    ("qwen3", dict(rope_scaling="yarn", rope_scaling_factor=2.0, rope_original_context=8,
                   rope_yarn_beta_fast=16.0, rope_yarn_attention_factor=1.25)),
    ("llama", dict(rope_scaling="linear", rope_scaling_factor=2.0)),
    ("phi3", dict(rope_scaling="frequency_factors", rope_frequency_factors=(1.0, 3.0))),
    ("gemma2", dict(attention_logit_softcap=0.0, final_logit_softcap=20.0)),
])
def test_rope_scaling_and_soft_caps_read_back(tmp_path, architecture, scaling):
    config = LlamaMistralConfig.preset(architecture, **{**DIMENSIONS, **scaling})
    bundle = capture(config)
    tokens = PretrainedTokenizer.from_vocabulary(byte_alphabet()).encode(PROMPT)[:PREFIX]
    path = export_gguf(bundle, tmp_path / "scaled.gguf")
    read, logits = gguf_logits(path, tokens)
    assert read == gguf_read_back_config(config)
    assert replace(read, random_seed=config.random_seed,
                   rms_norm_epsilon=config.rms_norm_epsilon,
                   norm_weight_offset=config.norm_weight_offset) == config
    assert largest_difference(logits, bundle_logits(bundle, tokens)) <= 1e-5


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_f16_export_is_the_f32_export_of_the_rounded_matrices(tmp_path, architecture):
    """F16 rounds each matrix value to nearest even (1-D norms and biases stay F32), and
    nothing else: its logits equal, within 1e-5, those of the F32 export of a bundle whose
    matrices were rounded the same way in Python. Against the unrounded model the logits move
    by the rounding's effect (relative 2^-11 per weight): under 5e-2 at these sizes."""
    config = preset(architecture)
    tokens = PretrainedTokenizer.from_vocabulary(byte_alphabet()).encode(PROMPT)[:PREFIX]

    def rounded(values, shapes):
        out, offset = [], 0
        for shape in shapes:
            count = 1
            for dim in shape:
                count *= dim
            part = values[offset:offset + count]
            if len(shape) == 2:
                part = struct.unpack(f"<{count}e", struct.pack(f"<{count}e", *part))
            out.extend(part)
            offset += count
        return out

    original = capture(config)
    with original.instantiate() as runtime:
        with runtime.model.parameters() as parameters:
            values, shapes = parameters.flat_values(), parameters.shapes
        unrounded = forward_values(runtime.model, tokens)
    half = export_gguf(original, tmp_path / "half.gguf", dtype="f16")
    reference = capture(config, weights=lambda *_: rounded(values, shapes))
    full = export_gguf(reference, tmp_path / "rounded.gguf")
    assert os.path.getsize(half) < os.path.getsize(full)
    _, half_logits = gguf_logits(half, tokens)
    _, full_logits = gguf_logits(full, tokens)
    assert largest_difference(half_logits, full_logits) <= 1e-5
    assert largest_difference(half_logits, unrounded) <= 5e-2


def byte_level_tokenizer(**options):
    tokens = byte_alphabet() + ["he", "Ġt", "Ġthe", "<|begin|>", "<|end|>"]
    types = [1] * 259 + [3, 3]
    return PretrainedTokenizer.from_vocabulary(
        tokens, merges=["h e", "Ġ t", "Ġt he"], token_types=types, bos_id=259, eos_id=260,
        **options)


def sentencepiece_tokenizer():
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "llo", "▁hello"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [0.0] * 8 + [-1.0, -2.0, -3.0, -4.0, -5.0]
    return PretrainedTokenizer.from_vocabulary(
        tokens, model="sentencepiece_bpe", token_types=types, scores=scores, bos_id=1, eos_id=2,
        unknown_id=0, add_dummy_prefix=True)


@pytest.mark.parametrize("kind", ["gpt2", "llama3", "smollm", "sentencepiece"])
def test_the_tokenizer_and_chat_template_round_trip(tmp_path, kind):
    if kind == "sentencepiece":
        tokenizer = sentencepiece_tokenizer()
    else:
        tokenizer = byte_level_tokenizer(pretokenizer=kind, ignore_merges=kind == "llama3")
    config = LlamaMistralConfig.preset(
        "llama", **{**DIMENSIONS, "vocabulary_size": tokenizer.vocabulary_size})
    bundle = capture(config, tokenizer, chat_template=CHAT_TEMPLATE)
    path = export_gguf(bundle, tmp_path / "model.gguf")
    read = PretrainedTokenizer.from_gguf(path)
    assert read.state() == tokenizer.state()
    texts = ["hello the world", "the<|end|> hello", " Hello, wörld! 123", "<s>hello</s>"]
    for text in texts:
        assert read.encode(text) == tokenizer.encode(text)
        assert read.encode(text, special=False) == tokenizer.encode(text, special=False)
    assert (read.bos_id, read.eos_id, read.unknown_id) == (
        tokenizer.bos_id, tokenizer.eos_id, tokenizer.unknown_id)
    assert gguf_metadata_string(path, "tokenizer.chat_template") == CHAT_TEMPLATE
    assert gguf_metadata_string(path, "tokenizer.ggml.model") == (
        "llama" if kind == "sentencepiece" else "gpt2")
    with load_pretrained(path) as loaded:
        assert isinstance(loaded.chat_template, PretrainedChatTemplate)
        assert loaded.chat_template.text == CHAT_TEMPLATE
    assert gguf_metadata_string(path, "general.name") == "model"


@pytest.mark.parametrize("kind", ["gpt2", "sentencepiece"])
def test_a_padded_vocabulary_gets_unused_padding_tokens(tmp_path, kind):
    tokenizer = (sentencepiece_tokenizer() if kind == "sentencepiece"
                 else byte_level_tokenizer(pretokenizer="gpt2"))
    size = tokenizer.vocabulary_size
    config = LlamaMistralConfig.preset("qwen2", **{**DIMENSIONS, "vocabulary_size": size + 7})
    bundle = capture(config, tokenizer)
    tokens = tokenizer.encode("hello the world, hello")
    path = export_gguf(bundle, tmp_path / "padded.gguf")
    read, logits = gguf_logits(path, tokens)
    assert read == gguf_read_back_config(config) and read.vocabulary_size == size + 7
    assert largest_difference(logits, bundle_logits(bundle, tokens)) <= 1e-5
    padded = PretrainedTokenizer.from_gguf(path)
    state, original = padded.state(), tokenizer.state()
    assert state["tokens"] == original["tokens"] + [f"[PAD{i}]" for i in range(size, size + 7)]
    assert state["token_types"] == original["token_types"] + [5] * 7  # unused
    for text in ("hello the world", "[PAD300] hello", f"[PAD{size}]"):
        assert padded.encode(text) == tokenizer.encode(text)


def test_a_loaded_pretrained_model_exports_as_its_bundle_does(tmp_path):
    bundle = capture(preset("qwen2"), chat_template=CHAT_TEMPLATE)
    bundle.save(tmp_path / "model.rift")
    from_bundle = export_gguf(tmp_path / "model.rift", tmp_path / "from_bundle.gguf", name="m")
    with load_pretrained(tmp_path / "model.rift") as loaded:
        from_model = export_gguf(loaded, tmp_path / "from_model.gguf", name="m")
    assert gguf_metadata_string(from_model, "general.name") == "m"
    assert from_bundle.read_bytes() == from_model.read_bytes()


def run_cli(*arguments):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    return subprocess.run([sys.executable, "-m", "riftco_transformer", *map(str, arguments)],
                          capture_output=True, text=True, env=environment, timeout=300)


def test_riftco_convert_writes_gguf_and_refuses_other_names(tmp_path):
    config = preset("gemma2")
    bundle = capture(config)
    source = bundle.save(tmp_path / "tuned.rift")
    tokens = PretrainedTokenizer.from_vocabulary(byte_alphabet()).encode(PROMPT)[:PREFIX]
    expected = bundle_logits(bundle, tokens)
    done = run_cli("convert", source, tmp_path / "tuned.gguf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tuned.gguf").read_bytes()[:8] == b"GGUF\x03\x00\x00\x00"
    assert largest_difference(gguf_logits(tmp_path / "tuned.gguf", tokens)[1], expected) <= 1e-5
    done = run_cli("convert", source, tmp_path / "half.gguf", "--dtype", "f16")
    assert done.returncode == 0, done.stderr
    assert os.path.getsize(tmp_path / "half.gguf") < os.path.getsize(tmp_path / "tuned.gguf")
    (tmp_path / "other").mkdir()  # the same stem: general.name is the file's stem
    done = run_cli("convert", source, tmp_path / "other" / "tuned.bin", "--to", "gguf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "other" / "tuned.bin").read_bytes() == (tmp_path / "tuned.gguf").read_bytes()
    # A name that says no format, or another one than --to, is refused, writing nothing.
    before = directory_files(tmp_path)
    for arguments in ((tmp_path / "tuned.bin",),
                      (tmp_path / "other.gguf", "--to", "safetensors"),
                      (tmp_path / "other.safetensors", "--to", "gguf"),
                      (tmp_path / "other.safetensors", "--dtype", "f16")):
        done = run_cli("convert", source, *arguments)
        assert done.returncode == 2, (arguments, done.stdout, done.stderr)
        assert done.stderr.startswith("riftco convert: error:"), done.stderr
        assert directory_files(tmp_path) == before
    done = run_cli("convert", tmp_path / "tuned.gguf", tmp_path / "back.rift")
    assert done.returncode == 2 and "GGUF file" in done.stderr
    # The safetensors path is as it was, and a safetensors bundle converts to GGUF too.
    done = run_cli("convert", source, tmp_path / "tuned.safetensors")
    assert done.returncode == 0, done.stderr
    done = run_cli("convert", tmp_path / "tuned.safetensors", tmp_path / "other" / "tuned.gguf")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "other" / "tuned.gguf").read_bytes() == (tmp_path / "tuned.gguf").read_bytes()


def gpt_bundle():
    with Tokenizer("a small corpus for a byte tokenizer", method="byte") as tokenizer, \
            DecoderOnlyTransformer(TransformerConfig(tokenizer.vocab_size, 16, 16, 2, 1, 32, 3)
                                   ) as model:
        return ModelBundle.capture(model, tokenizer, "pretraining")


def refused_sources():
    """(what, source, message pattern) for every case the exporter refuses."""
    gpt2 = LlamaMistralConfig.preset("gpt2", **{**DIMENSIONS, "key_value_head_count": 4})
    with Tokenizer("a small corpus for a byte tokenizer", method="byte") as ours:
        own = capture(LlamaMistralConfig.preset(
            "llama", **{**DIMENSIONS, "vocabulary_size": ours.vocab_size}), ours)
    return [
        ("gpt decoder", gpt_bundle(), "riftco_decoder_v1"),
        ("gpt2 preset", capture(gpt2), "architecture 'gpt2'"),
        ("our tokenizer", own, "tokenizer is one of our own training"),
        ("padding taken", capture(replace(preset("qwen2"), vocabulary_size=258),
                                  PretrainedTokenizer.from_vocabulary(byte_alphabet()
                                                                      + ["[PAD257]"])),
         "padding token '\\[PAD257\\]'"),
        ("gemma3 local theta", capture(replace(preset("gemma3"), rope_local_theta=5000.0)),
         "rope_local_theta=5000.0"),
        ("attention scale", capture(replace(preset("llama"), attention_scale=0.5)),
         "attention_scale=0.5"),
        ("window period", capture(replace(preset("mistral"), sliding_window_period=2)),
         "sliding_window_period=2"),
    ]


def test_every_refusal_names_the_reason_and_leaves_no_file(tmp_path):
    ignore = byte_level_tokenizer(ignore_merges=True)  # gpt-2 pre-tokenizer: GGUF sets it off
    cases = refused_sources()
    cases.append(("ignore_merges", capture(replace(preset("llama"),
                                                   vocabulary_size=ignore.vocabulary_size),
                                           ignore), "ignore_merges=True"))
    for what, source, pattern in cases:
        destination = tmp_path / f"{what.replace(' ', '_')}.gguf"
        with pytest.raises(ValueError, match=pattern):
            export_gguf(source, destination)
        assert directory_files(tmp_path) == [], what
    bundle = capture(preset("llama"))
    with pytest.raises(ValueError, match="dtype must be one of f32, f16"):
        export_gguf(bundle, tmp_path / "x.gguf", dtype="q8_0")
    with pytest.raises(TypeError, match="source must be"):
        export_gguf(42, tmp_path / "x.gguf")
    # Float16 overflow is found while writing: the temporary file goes too.
    huge = capture(preset("llama"), weights=lambda values, _: [1e5] * len(values))
    with pytest.raises(ValueError, match="beyond float16's range"):
        export_gguf(huge, tmp_path / "huge.gguf", dtype="f16")
    assert directory_files(tmp_path) == []
    export_gguf(huge, tmp_path / "huge.gguf")  # F32 holds it
    # A failed export keeps the file it would have replaced.
    (tmp_path / "huge.gguf").write_bytes(b"kept")
    with pytest.raises(ValueError):
        export_gguf(huge, tmp_path / "huge.gguf", dtype="f16")
    assert (tmp_path / "huge.gguf").read_bytes() == b"kept"


def test_a_model_with_unmerged_lora_or_nf4_is_refused(tmp_path):
    tokenizer = PretrainedTokenizer.from_vocabulary(byte_alphabet())
    template = PretrainedChatTemplate.from_text(CHAT_TEMPLATE, source="test")
    model = LlamaMistralTransformer(preset("llama"))
    pretrained = PretrainedModel(model, tokenizer, template, "llama", "memory")
    try:
        model.attach_lora()
        with pytest.raises(ValueError, match="LoRA"):
            export_gguf(pretrained, tmp_path / "lora.gguf")
        model.merge_lora()
        export_gguf(pretrained, tmp_path / "merged.gguf")
    finally:
        pretrained.close()
    assert directory_files(tmp_path) == ["merged.gguf"]


READER = textwrap.dedent("""
    import json, sys
    import gguf
    reader = gguf.GGUFReader(sys.argv[1])
    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        kind = field.types[0].name
        if kind == "ARRAY":
            # An empty array records no element type in the reader's view.
            element = field.types[1].name if len(field.types) > 1 else None
            fields[name] = [kind, element, len(field.data)]
        elif kind == "STRING":
            fields[name] = [kind, bytes(field.parts[field.data[0]]).decode()]
        else:
            fields[name] = [kind, field.parts[field.data[0]].tolist()[0]]
    tensors = {t.name: [t.tensor_type.name, [int(n) for n in t.shape],
                        [float(v) for v in t.data.reshape(-1)[:4]]] for t in reader.tensors}
    print(json.dumps({"fields": fields, "tensors": tensors}))
""")


@pytest.mark.parametrize("architecture, dtype", [("llama", "f32"), ("gemma2", "f16"),
                                                 ("phi3", "f32"), ("qwen2", "f16")])
def test_the_gguf_package_reads_the_file(tmp_path, architecture, dtype):
    python = oracle_python("gguf")
    config = preset(architecture)
    bundle = capture(config, chat_template=CHAT_TEMPLATE)
    path = export_gguf(bundle, tmp_path / "model.gguf", dtype=dtype)
    done = subprocess.run([python, "-c", READER, str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    fields, tensors = read["fields"], read["tensors"]
    arch = "llama" if architecture == "mistral" else architecture
    d = config.resolved_head_width
    assert fields["general.architecture"] == ["STRING", arch]
    assert fields["general.file_type"] == ["UINT32", {"f32": 0, "f16": 1}[dtype]]
    assert fields[f"{arch}.block_count"] == ["UINT32", config.block_count]
    assert fields[f"{arch}.embedding_length"] == ["UINT32", config.model_width]
    assert fields[f"{arch}.attention.head_count_kv"] == ["UINT32", config.key_value_head_count]
    assert fields[f"{arch}.attention.key_length"] == ["UINT32", d]
    assert fields[f"{arch}.rope.freq_base"] == ["FLOAT32", config.rope_theta]
    assert fields[f"{arch}.attention.layer_norm_rms_epsilon"][0] == "FLOAT32"
    assert fields["tokenizer.ggml.model"] == ["STRING", "gpt2"]
    assert fields["tokenizer.ggml.pre"] == ["STRING", "gpt-2"]
    assert fields["tokenizer.ggml.tokens"] == ["ARRAY", "STRING", 256]
    assert fields["tokenizer.ggml.token_type"] == ["ARRAY", "INT32", 256]
    assert fields["tokenizer.ggml.merges"] == ["ARRAY", None, 0]
    assert "tokenizer.ggml.bos_token_id" not in fields
    assert fields["tokenizer.chat_template"] == ["STRING", CHAT_TEMPLATE]
    if config.sliding_window:
        assert fields[f"{arch}.attention.sliding_window"] == ["UINT32", config.sliding_window]
    if architecture == "gemma2":
        assert fields["gemma2.attn_logit_softcapping"] == ["FLOAT32", 50.0]
        assert fields["gemma2.final_logit_softcapping"] == ["FLOAT32", 30.0]
    matrix = "F16" if dtype == "f16" else "F32"
    expected = {"token_embd.weight": [matrix, [16, 256]],
                "output_norm.weight": ["F32", [16]]}
    if config.rope_scaling == "llama3":
        expected["rope_freqs.weight"] = ["F32", [d // 2]]
    for block in range(config.block_count):
        prefix = f"blk.{block}."
        expected.update({prefix + "attn_norm.weight": ["F32", [16]],
                         prefix + "attn_q.weight": [matrix, [16, 4 * d]],
                         prefix + "attn_k.weight": [matrix, [16, 2 * d]],
                         prefix + "attn_v.weight": [matrix, [16, 2 * d]],
                         prefix + "attn_output.weight": [matrix, [4 * d, 16]],
                         prefix + "ffn_norm.weight": ["F32", [16]],
                         prefix + "ffn_gate.weight": [matrix, [16, 24]],
                         prefix + "ffn_up.weight": [matrix, [16, 24]],
                         prefix + "ffn_down.weight": [matrix, [24, 16]]})
        if config.query_key_value_bias:
            expected.update({prefix + "attn_q.bias": ["F32", [4 * d]],
                             prefix + "attn_k.bias": ["F32", [2 * d]],
                             prefix + "attn_v.bias": ["F32", [2 * d]]})
        if config.post_block_norms:
            expected.update({prefix + "post_attention_norm.weight": ["F32", [16]],
                             prefix + "post_ffw_norm.weight": ["F32", [16]]})
    if not config.tie_embeddings:
        expected["output.weight"] = [matrix, [16, 256]]
    if architecture == "phi3":  # fused, as llama.cpp's converter writes (and reads) Phi-3
        for block in range(config.block_count):
            prefix = f"blk.{block}."
            for part in ("attn_q", "attn_k", "attn_v", "ffn_gate"):
                del expected[prefix + part + ".weight"]
            expected[prefix + "attn_qkv.weight"] = [matrix, [16, 8 * d]]
            expected[prefix + "ffn_up.weight"] = [matrix, [16, 48]]
    assert {name: value[:2] for name, value in tensors.items()} == expected
    # The values too: the embedding's first row as the bundle holds it (F16: rounded).
    first = list(bundle.weights[:4])
    if dtype == "f16":
        first = list(struct.unpack("<4e", struct.pack("<4e", *first)))
    assert tensors["token_embd.weight"][2] == pytest.approx(first, abs=1e-7)
    if architecture.startswith("gemma"):  # norms stored as 1 + w
        index = {spec.name: spec for spec in bundle.parameters}["final_norm.scale"]
        stored = bundle.weights[index.offset:index.offset + 4]
        assert tensors["output_norm.weight"][2] == pytest.approx([1 + w for w in stored],
                                                                 abs=1e-6)
