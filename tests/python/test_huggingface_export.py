"""Hugging Face directory export (interchange/huggingface_export.py): the inverse of our
importer, checked by reading every export back with it, and (when the oracle venv is named by
$RIFTCO_TRANSFORMER_HF_PYTHON) with transformers and tokenizers themselves."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from test_decoder_families import DIMENSIONS, FAMILIES, YARN, byte_alphabet, forward_values

from riftco_transformer import LlamaMistralConfig, LlamaMistralTransformer
from riftco_transformer.artifacts import ModelBundle
from riftco_transformer.interchange import export_huggingface
from riftco_transformer.interchange.huggingface import load_huggingface
from riftco_transformer.interchange.huggingface_export import _bf16, _f16
from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer

HF_PYTHON_VARIABLE = "RIFTCO_TRANSFORMER_HF_PYTHON"
SMOLLM2_F32 = Path.home() / ".cache" / "riftco-transformer" / "models" / \
    "SmolLM2-135M-Instruct.F32.gguf"

# A byte-level vocabulary with merges, two control tokens and a user-defined one.
EXTRA_TOKENS = ["Ġt", "he", "Ġthe", "in", "Ġin", "<|im_start|>", "<|im_end|>", "<tool>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ in"]
VOCABULARY = 256 + len(EXTRA_TOKENS) + 6  # six padding rows past the tokenizer
TEXTS = ["Hello, world!", "the 2024 thing in there", "  spaces\tand\nlines  ",
         "<|im_start|>user\nhi<|im_end|>", "naïve café ☕ 你好", "x<tool>y 12345 !!!"]

# The families as the decoder-family tests build them, plus scalings and windows config.json
# can express in more ways.
VARIANTS = {
    **{name: (name, fields) for name, fields in FAMILIES.items()},
    "llama_linear": ("llama", dict(rope_scaling="linear", rope_scaling_factor=2.0,
                                   rope_theta=5e5)),
    "qwen2_yarn": ("qwen2", YARN),
    "qwen3_yarn_default_attention": ("qwen3", {**YARN, "rope_yarn_attention_factor": 0.0,
                                               "head_width": 6}),
    "gemma3_linear": ("gemma3", dict(block_count=6, head_width=6, sliding_window=4,
                                     tie_embeddings=True, rope_scaling="linear",
                                     rope_scaling_factor=4.0, rope_local_theta=2e4)),
    "gemma2_no_caps": ("gemma2", dict(block_count=4, head_width=6, sliding_window=4,
                                      tie_embeddings=True)),
    "phi3_dense": ("phi3", dict(tie_embeddings=False)),
}


def tokenizer(pretokenizer: str = "gpt2") -> PretrainedTokenizer:
    tokens = byte_alphabet() + EXTRA_TOKENS
    types = [1] * (len(tokens) - 3) + [3, 3, 4]
    return PretrainedTokenizer.from_vocabulary(
        tokens, pretokenizer=pretokenizer, merges=MERGES, token_types=types,
        bos_id=len(tokens) - 3, eos_id=len(tokens) - 2)


def variant_config(variant: str, seed: int = 11) -> LlamaMistralConfig:
    architecture, fields = VARIANTS[variant]
    config = LlamaMistralConfig.preset(architecture, **{
        **DIMENSIONS, "vocabulary_size": VOCABULARY, "maximum_context": 64,
        "random_seed": seed, **fields})
    if variant == "gemma2_no_caps":
        config = replace(config, attention_logit_softcap=0.0, final_logit_softcap=0.0)
    return config


def variant_bundle(variant: str, pretokenizer: str = "gpt2",
                   chat_template: str | None = None) -> ModelBundle:
    with LlamaMistralTransformer(variant_config(variant)) as model, \
            tokenizer(pretokenizer) as vocabulary:
        return ModelBundle.capture(model, vocabulary, "pretrained", chat_template=chat_template)


def loader_attention(config: LlamaMistralConfig) -> str:
    """The attention load_huggingface gives a model of ``config`` (materialized with a window
    shorter than the context, else flash): the same kernels give the same bits."""
    window = config.sliding_window
    return "materialized" if window is not None and window < config.maximum_context else "flash"


def bundle_logits(bundle: ModelBundle, tokens: list[int],
                  attention: str = "materialized") -> list[list[float]]:
    with bundle.instantiate(attention=attention) as runtime:
        return forward_values(runtime.model, tokens)


def flat(values) -> list[float]:
    """Logits as one list (ours come flat, transformers' as rows)."""
    return [x for row in values for x in row] if values and isinstance(values[0], list) \
        else list(values)


def max_difference(ours, theirs) -> float:
    return max(abs(a - b) for a, b in zip(flat(ours), flat(theirs), strict=True))


TOKENS = [259, 5, 77, 200, 258, 3, 9, 261, 262, 11, 12, 40, 41, 42, 43, 44, 45, 46, 47, 48]


# ---- our importer reads back what we write ------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_an_f32_export_reloads_with_the_same_config_logits_and_tokenizer(tmp_path, variant):
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}")
    bundle = variant_bundle(variant, chat_template=template)
    directory = export_huggingface(bundle, tmp_path / "out")
    assert directory == tmp_path / "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left
    assert sorted(p.name for p in directory.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    config = bundle.config
    document = json.loads((directory / "config.json").read_text())
    assert document["torch_dtype"] == "float32"
    header_length = int.from_bytes((directory / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((directory / "model.safetensors").read_bytes()[8:8 + header_length])
    assert header["__metadata__"] == {"format": "pt"}
    assert ("lm_head.weight" in header) == (not config.tie_embeddings)
    if config.architecture == "phi3":
        assert "model.layers.0.self_attn.qkv_proj.weight" in header
        assert "model.layers.0.mlp.gate_up_proj.weight" in header
    with load_huggingface(directory) as model:
        assert replace(model.model.config, random_seed=config.random_seed) == config
        with model.model.parameters() as parameters:
            assert parameters.flat_values() == bundle.weights  # every value exact
        attention = loader_attention(config)
        assert forward_values(model.model, TOKENS) == bundle_logits(bundle, TOKENS, attention)
        state = model.tokenizer.state()
        assert state["tokens"] == bundle.tokenizer_state["tokens"]
        assert state["merges"] == MERGES
        assert state["token_types"] == bundle.tokenizer_state["token_types"]
        assert (state["bos_id"], state["eos_id"]) == (261, 262)
        assert model.chat_template.text == template
        with bundle.tokenizer() as ours:
            for text in TEXTS:
                assert model.tokenizer.encode(text) == ours.encode(text), text


@pytest.mark.parametrize("pretokenizer", ["gpt2", "llama3", "qwen2", "smollm"])
def test_each_byte_level_pretokenizer_reads_back_as_itself(tmp_path, pretokenizer):
    bundle = variant_bundle("qwen2", pretokenizer=pretokenizer)
    directory = export_huggingface(bundle, tmp_path / pretokenizer)
    with load_huggingface(directory) as model, bundle.tokenizer() as ours:
        assert model.tokenizer.state()["pretokenizer"] == pretokenizer
        for text in [*TEXTS, "1234567 numbers 89"]:
            assert model.tokenizer.encode(text) == ours.encode(text), text


def test_a_pretrained_model_and_a_rift_path_are_sources_too(tmp_path):
    bundle = variant_bundle("qwen3")
    path = bundle.save(tmp_path / "model.rift")
    export_huggingface(path, tmp_path / "from_path")
    with load_huggingface(tmp_path / "from_path") as model:
        export_huggingface(model, tmp_path / "from_model")
    first = (tmp_path / "from_path" / "model.safetensors").read_bytes()
    assert (tmp_path / "from_model" / "model.safetensors").read_bytes() == first


def half_ulp(value: float, mantissa_bits: int, minimum_exponent: int) -> float:
    """Half a unit in the last place of ``value`` in a binary format with ``mantissa_bits``
    stored bits and normal numbers from 2**minimum_exponent (subnormals below)."""
    _, exponent = math.frexp(value)  # value = m·2**e with 0.5 <= |m| < 1
    return 2.0 ** (max(exponent - 1, minimum_exponent) - mantissa_bits) / 2


@pytest.mark.parametrize("dtype, mantissa_bits, minimum_exponent",
                         [("bf16", 7, -126), ("f16", 10, -14)])
@pytest.mark.parametrize("variant", ["llama", "gemma3", "phi3"])
def test_rounded_exports_hold_the_nearest_values_and_close_logits(tmp_path, variant, dtype,
                                                                   mantissa_bits,
                                                                   minimum_exponent):
    bundle = variant_bundle(variant)
    directory = export_huggingface(bundle, tmp_path / dtype, dtype=dtype)
    document = json.loads((directory / "config.json").read_text())
    assert document["torch_dtype"] == {"bf16": "bfloat16", "f16": "float16"}[dtype]
    source = bundle.weights
    with load_huggingface(directory) as model:
        with model.model.parameters() as parameters:
            values = parameters.flat_values()
        assert len(values) == len(source)
        worst = max(abs(a - b) - half_ulp(b, mantissa_bits, minimum_exponent)
                    for a, b in zip(values, source))
        assert worst <= 0.0  # every value is within half an ulp: the nearest one
        assert values != source  # and something was rounded
        logits = forward_values(model.model, TOKENS)
    difference = max_difference(logits, bundle_logits(bundle, TOKENS,
                                                      loader_attention(bundle.config)))
    print(f"{variant} {dtype}: max |logit difference| {difference:.3g}")
    # Weights off by up to 2**-9 (bf16) or 2**-12 (f16) relative move these tiny models' logits
    # (|logit| up to ~2) by a few of those steps, eight times more in bf16.
    assert 0 < difference < {"bf16": 0.1, "f16": 0.0125}[dtype]


def test_rounding_is_to_nearest_even_at_ties():
    # bfloat16 keeps the top 16 bits: 1 + 2**-8 lies halfway between 1 and 1 + 2**-7.
    values = array("f", [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20,
                         float("inf"), float("nan"), 0.0, -0.0])
    halves = array("H")
    halves.frombytes(_bf16(values, "t"))
    if struct.pack("=H", 1) != struct.pack("<H", 1):
        halves.byteswap()
    assert list(halves[:4]) == [0x3F80, 0x3F82, 0xBF80, 0x3F81]
    assert halves[4] == 0x7F80 and halves[5] & 0x7FC0 == 0x7FC0
    assert list(halves[6:]) == [0x0000, 0x8000]
    # float16: 1 + 2**-11 is halfway between 1 and 1 + 2**-10.
    data = _f16(array("f", [1 + 2**-11, 1 + 3 * 2**-11, 65504.0]), "t")
    assert struct.unpack("<3e", data) == (1.0, 1 + 2 * 2**-10, 65504.0)
    with pytest.raises(ValueError, match="beyond float16's range"):
        _f16(array("f", [70000.0]), "too big")
    with pytest.raises(ValueError, match="rounds to an infinity in bfloat16"):
        _bf16(array("f", [3.4028234663852886e38]), "too big")


# ---- refusals -----------------------------------------------------------------------------


def assert_nothing_written(tmp_path, before):
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_gpt_decoder_bundle_is_refused_and_nothing_is_written(tmp_path):
    from riftco_transformer.pretraining import PretrainingConfig, pretrain_text

    text = "a small corpus of words for a tiny model " * 20
    config = PretrainingConfig(steps=1, tokenizer_method="byte", backend="cpu",
                               evaluation_interval=1)
    bundle = pretrain_text(text, config).bundle
    with pytest.raises(ValueError, match="GPT decoder"):
        export_huggingface(bundle, tmp_path / "gpt")
    assert_nothing_written(tmp_path, [])


def test_a_tokenizer_of_our_own_training_is_refused(tmp_path):
    from riftco_transformer.pretraining import PretrainingConfig, pretrain_text

    text = "a small corpus of words for a tiny model " * 20
    config = PretrainingConfig(steps=1, tokenizer_method="bpe", vocabulary_size=260,
                               architecture="llama", backend="cpu", evaluation_interval=1)
    bundle = pretrain_text(text, config).bundle
    assert bundle.tokenizer_state["method"] == "bpe"
    with pytest.raises(ValueError, match="tokenizer is one of our own training .'bpe'."):
        export_huggingface(bundle, tmp_path / "bpe")
    assert_nothing_written(tmp_path, [])


def test_a_sentencepiece_tokenizer_is_refused(tmp_path):
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", "h"]
    with PretrainedTokenizer.from_vocabulary(
            tokens, model="sentencepiece_bpe", token_types=[2, 3, 3] + [6] * 256 + [1, 1],
            scores=[0.0] * len(tokens), unknown_id=0) as vocabulary, \
            LlamaMistralTransformer(variant_config("llama")) as model:
        bundle = ModelBundle.capture(model, vocabulary, "pretrained")
    with pytest.raises(ValueError, match="sentencepiece_bpe"):
        export_huggingface(bundle, tmp_path / "sp")
    assert_nothing_written(tmp_path, [])


@pytest.mark.parametrize("variant, fields, field", [
    ("llama", dict(sliding_window=4), "sliding_window"),  # LlamaConfig has no window
    ("qwen2", dict(sliding_window=4), "sliding_window"),  # nor Qwen without its layer rule
    ("llama", dict(attention_scale=0.3), "attention_scale"),
    ("qwen3", dict(query_key_norm=False), "query_key_norm"),
    ("phi3", YARN, "rope_scaling"),  # transformers reads Phi-3's yarn as LongRoPE
    ("llama", dict(rope_scaling="frequency_factors",
                   rope_frequency_factors=(1.0, 2.0)), "frequency_factors"),
])
def test_a_config_that_config_json_cannot_express_is_refused(tmp_path, variant, fields, field):
    config = replace(variant_config(variant), **fields)
    with LlamaMistralTransformer(config) as model, tokenizer() as vocabulary:
        bundle = ModelBundle.capture(model, vocabulary, "pretrained")
    with pytest.raises(ValueError, match=field):
        export_huggingface(bundle, tmp_path / "out")
    assert_nothing_written(tmp_path, [])


def test_an_existing_non_empty_directory_and_a_bad_dtype_are_refused(tmp_path):
    bundle = variant_bundle("llama")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        export_huggingface(bundle, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        export_huggingface(bundle, tmp_path / "file")
    with pytest.raises(ValueError, match="dtype must be one of f32, bf16, f16"):
        export_huggingface(bundle, tmp_path / "new", dtype="f64")
    assert_nothing_written(tmp_path, ["file", "full"])
    (tmp_path / "empty").mkdir()
    export_huggingface(bundle, tmp_path / "empty", dtype="bf16")  # an empty one is taken
    assert (tmp_path / "empty" / "model.safetensors").is_file()
    assert_nothing_written(tmp_path, ["empty", "file", "full"])


def test_a_failure_while_writing_leaves_nothing(tmp_path):
    bundle = variant_bundle("llama")
    weights = bundle._weights
    weights[7] = 1e6  # beyond float16: found only while the tensors are written
    with pytest.raises(ValueError, match="beyond float16's range"):
        export_huggingface(bundle, tmp_path / "out", dtype="f16")
    assert_nothing_written(tmp_path, [])


# ---- transformers and tokenizers (the oracle venv) ------------------------------------------

ORACLE = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM
requests = json.load(sys.stdin)
results = []
for request in requests:
    # float32 by default; "float64" runs the model in double precision (the exact model, to
    # within float64 rounding: an oracle whose own error does not add to ours).
    dtype = getattr(torch, request.get("dtype", "float32"))
    try:
        model = AutoModelForCausalLM.from_pretrained(request["directory"], dtype=dtype,
                                                     attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(request["directory"], torch_dtype=dtype,
                                                     attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([request["tokens"]])).logits[0]
    results.append(logits.double().tolist())
print(json.dumps(results))
"""

TOKENIZER_ORACLE = r"""
import json, sys
from tokenizers import Tokenizer
request = json.load(sys.stdin)
tokenizer = Tokenizer.from_file(request["path"])
print(json.dumps([tokenizer.encode(text).ids for text in request["texts"]]))
"""


def hf_python(module: str) -> str:
    """The oracle venv's interpreter, checked to import ``module`` (skips without it)."""
    python = os.environ.get(HF_PYTHON_VARIABLE)
    if not python:
        pytest.skip(f"{HF_PYTHON_VARIABLE} is not set (a venv with {module}), and this "
                    "interpreter has no tokenizers package" if module == "tokenizers" else
                    f"{HF_PYTHON_VARIABLE} is not set (a venv with {module} and torch)")
    try:
        completed = subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                                   text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"{HF_PYTHON_VARIABLE}={python!r} cannot run: {error}")
    if completed.returncode != 0:
        reason = (completed.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"{HF_PYTHON_VARIABLE}={python!r} cannot import {module}: {reason}")
    return python


def run_oracle(python: str, script: str, request) -> object:
    completed = subprocess.run([python, "-c", script], input=json.dumps(request),
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def close_enough(ours, theirs, tolerance: float = 1e-4) -> float:
    """The largest |ours - theirs|; asserts each within tolerance·(1 + |theirs|)."""
    worst = 0.0
    for index, (a, b) in enumerate(zip(flat(ours), flat(theirs), strict=True)):
        assert abs(a - b) <= tolerance * (1 + abs(b)), (index, a, b)
        worst = max(worst, abs(a - b))
    return worst


def test_transformers_reads_every_family_export_with_our_logits(tmp_path):
    python = hf_python("transformers")
    requests, expected = [], []
    for variant in sorted(VARIANTS):
        bundle = variant_bundle(variant)
        directory = export_huggingface(bundle, tmp_path / variant)
        requests.append({"directory": str(directory), "tokens": TOKENS})
        expected.append((variant, bundle_logits(bundle, TOKENS)))
    results = run_oracle(python, ORACLE, requests)
    for (variant, ours), theirs in zip(expected, results, strict=True):
        print(f"{variant}: max |ours - transformers| {close_enough(ours, theirs):.3g}")


def tokenizer_ids(path: Path, texts: list[str]) -> list[list[int]]:
    """``tokenizers``' ids of ``texts`` with ``path`` (tokenizer.json): in this interpreter
    when it has the package, else in the oracle venv; skips without either."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        python = hf_python("tokenizers")
        return run_oracle(python, TOKENIZER_ORACLE, {"path": str(path), "texts": texts})
    loaded = Tokenizer.from_file(str(path))
    return [loaded.encode(text).ids for text in texts]


@pytest.mark.parametrize("pretokenizer", ["gpt2", "llama3", "qwen2", "smollm"])
def test_tokenizers_encodes_an_exported_tokenizer_as_ours(tmp_path, pretokenizer):
    bundle = variant_bundle("llama", pretokenizer=pretokenizer)
    directory = export_huggingface(bundle, tmp_path / "out")
    texts = [*TEXTS, "1234567 numbers 89", "it's 'll they're"]
    with bundle.tokenizer() as ours:
        assert tokenizer_ids(directory / "tokenizer.json", texts) == [ours.encode(t)
                                                                      for t in texts]


# ---- the real model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if not SMOLLM2_F32.is_file():
        pytest.skip(f"{SMOLLM2_F32} is absent (SmolLM2-135M-Instruct as F32 GGUF)")
    from riftco_transformer import load_pretrained

    directory = tmp_path_factory.mktemp("smollm2") / "hf"
    with load_pretrained(SMOLLM2_F32) as model:
        text = model.render_chat([{"role": "user", "content": "What is 2+2? Answer: ½ ≈ 0.5!"}])
        tokens = model.tokenizer.encode(text)[:24]
        logits = forward_values(model.model, tokens)
        export_huggingface(model, directory)
        texts = [*TEXTS, "SmolLM2 counts 1234567890 in 3.14 ways", text]
        ids = [model.tokenizer.encode(t) for t in texts]
    return directory, tokens, logits, texts, ids


def test_smollm2_reloads_with_identical_logits(smollm2):
    from riftco_transformer import load_pretrained

    directory, tokens, logits, texts, ids = smollm2
    with load_pretrained(directory) as model:
        assert forward_values(model.model, tokens) == logits
        assert [model.tokenizer.encode(t) for t in texts] == ids
        assert model.tokenizer.eos_id == 2


def test_smollm2_tokenizer_json_encodes_as_ours_in_tokenizers(smollm2):
    directory, _, _, texts, ids = smollm2
    assert tokenizer_ids(directory / "tokenizer.json", texts) == ids


def test_smollm2_export_runs_in_transformers_with_our_logits(smollm2):
    python = hf_python("transformers")
    directory, tokens, logits, _, _ = smollm2
    (theirs,) = run_oracle(python, ORACLE, [{"directory": str(directory), "tokens": tokens}])
    print(f"SmolLM2: max |ours - transformers| {close_enough(logits, theirs):.3g}")


def test_riftco_export_to_hf_writes_a_directory_that_reloads_and_refuses_a_file_name(tmp_path):
    """`riftco export --to hf` (convert's alias) writes the directory our importer reloads
    with the same logits; a file name with a format's extension, or bf16 for GGUF, is a usage
    error that writes nothing."""
    import sys

    from conftest import PYTHON_SOURCE

    bundle = variant_bundle("llama")
    source = bundle.save(tmp_path / "tuned.rift")
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}

    def riftco(*arguments):
        return subprocess.run([sys.executable, "-m", "riftco_transformer", *map(str, arguments)],
                              capture_output=True, text=True, env=environment, timeout=300)

    done = riftco("export", source, tmp_path / "tuned-hf", "--to", "hf", "--dtype", "bf16")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "tuned-hf" / "config.json").read_text())["torch_dtype"] == \
        "bfloat16"
    done = riftco("convert", source, tmp_path / "exact-hf", "--to", "hf")
    assert done.returncode == 0, done.stderr
    tokens = [1, 5, 9, 2, 7]
    with load_huggingface(tmp_path / "exact-hf") as loaded:
        reloaded = forward_values(loaded.model, tokens)
    assert max_difference(reloaded,
                          bundle_logits(bundle, tokens, loader_attention(bundle.config))) == 0.0
    before = sorted(p.name for p in tmp_path.iterdir())
    for arguments in ((tmp_path / "x.gguf", "--to", "hf"),
                      (tmp_path / "y.gguf", "--dtype", "bf16"),
                      (tmp_path / "z.safetensors", "--dtype", "bf16")):
        done = riftco("export", source, *arguments)
        assert done.returncode == 2, (arguments, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_riftco_inspect_summarises_a_huggingface_directory_and_a_gguf_file(tmp_path):
    import sys

    from conftest import PYTHON_SOURCE

    from riftco_transformer.interchange import export_gguf

    bundle = variant_bundle("qwen3")
    export_huggingface(bundle, tmp_path / "hf", dtype="f16")
    export_gguf(bundle, tmp_path / "model.gguf")
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}

    def inspect(path, *extra):
        return subprocess.run([sys.executable, "-m", "riftco_transformer", "inspect", str(path),
                               *extra], capture_output=True, text=True, env=environment,
                              timeout=120)

    config = bundle.config
    done = inspect(tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert "architecture qwen3" in done.stdout
    assert (f"V={config.vocabulary_size} C={config.maximum_context} D={config.model_width} "
            f"N={config.block_count} F={config.feed_forward_width}") in done.stdout
    assert "F16)" in done.stdout and "tokenizer.json" in done.stdout
    done = inspect(tmp_path / "model.gguf")
    assert done.returncode == 0, done.stderr
    assert "architecture qwen3" in done.stdout and "pre-tokenizer" in done.stdout
    assert inspect(tmp_path / "model.gguf", "--json").returncode == 2
