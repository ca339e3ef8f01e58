"""Hugging Face directories are checked before they are trusted (issue 27, item 2).

``config.json`` is compared with the safetensors headers (every shard) before a model, or
anything as large as the config says, exists: a layer count or vocabulary that the tensors
do not have fails at once, naming config.json, the field and both values. The model classes
are replaced by ones that fail the test when constructed, so "fails before building" is a
structural check, not a timing. ``tokenizer.json`` and ``config.json`` are strict JSON (no
duplicate key, nesting too deep reported as such), and every field the loader reads is
checked: each problem is a ValueError naming the file and the JSON path. Every error test
also checks that the directory is left exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
from pathlib import Path

import pytest

from riftco_transformer import PretrainedTokenizer
from riftco_transformer.interchange import huggingface, huggingface_gpt2
from riftco_transformer.interchange.huggingface import load_huggingface
from support import oracle_python
from test_huggingface_gpt2 import hand_built as gpt2_hand_built
from test_huggingface_import import (
    CONFIG,
    byte_level_alphabet,
    random_f32,
    safetensors_bytes,
    write_config,
    write_tokenizer,
)

# ---- every family's tensors, written out independently of the importer's tables

# Config changes that make CONFIG (a 2-layer Llama, D 16, 4 query and 2 key/value heads,
# F 24, V 260) a checkpoint of each family. Gemma 2 and 3 name head_dim (their default is 256)
# and tie their head, as their configs do.
FAMILIES = {
    "llama": {},
    "mistral": {"architectures": ["MistralForCausalLM"], "sliding_window": 4},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"]},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 6},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "head_dim": 4,
               "tie_word_embeddings": True, "sliding_window": 4,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "head_dim": 4,
               "tie_word_embeddings": True, "sliding_window": 4},
    "phi3": {"architectures": ["Phi3ForCausalLM"]},
}


def family_shapes(family: str, config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a ``family`` checkpoint of ``config``, Hugging Face name -> shape."""
    width, ffn, vocabulary = config["hidden_size"], config["intermediate_size"], \
        config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head = config.get("head_dim") or width // heads
    q, k = heads * head, kv * head
    block = {"input_layernorm.weight": (width,), "self_attn.o_proj.weight": (width, q),
             "mlp.down_proj.weight": (width, ffn)}
    if family == "phi3":
        block.update({"self_attn.qkv_proj.weight": (q + 2 * k, width),
                      "mlp.gate_up_proj.weight": (2 * ffn, width),
                      "post_attention_layernorm.weight": (width,)})
    else:
        block.update({"self_attn.q_proj.weight": (q, width),
                      "self_attn.k_proj.weight": (k, width),
                      "self_attn.v_proj.weight": (k, width),
                      "mlp.gate_proj.weight": (ffn, width), "mlp.up_proj.weight": (ffn, width)})
    if family == "qwen2":
        block.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (k,),
                      "self_attn.v_proj.bias": (k,)})
    if family in ("qwen3", "gemma3"):
        block.update({"self_attn.q_norm.weight": (head,), "self_attn.k_norm.weight": (head,)})
    if family in ("gemma2", "gemma3"):
        block.update({"post_attention_layernorm.weight": (width,),
                      "pre_feedforward_layernorm.weight": (width,),
                      "post_feedforward_layernorm.weight": (width,)})
    elif family != "phi3":
        block["post_attention_layernorm.weight"] = (width,)
    shapes = {"model.embed_tokens.weight": (vocabulary, width), "model.norm.weight": (width,)}
    for layer in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{layer}.{name}": shape for name, shape in block.items()})
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocabulary, width)
    return shapes


def family_checkpoint(directory: Path, family: str, **changes) -> Path:
    """A tiny random checkpoint of ``family`` (the tensors of CONFIG's sizes), its config.json
    with ``changes`` applied on top."""
    directory.mkdir(parents=True, exist_ok=True)
    base = {**CONFIG, **FAMILIES[family]}
    generator = random.Random(11)
    tensors = {name: ("F32", shape, random_f32(shape, generator))
               for name, shape in family_shapes(family, base).items()}
    (directory / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    write_config(directory, **{**FAMILIES[family], **changes})
    write_tokenizer(directory)
    return directory


def snapshot(directory: Path) -> dict[str, str]:
    """Every file of ``directory`` by name, as a digest of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.iterdir())}


class NeverBuilt:
    """Stands for a model class: constructing one fails the test."""

    def __init__(self, *arguments, **keywords) -> None:
        raise AssertionError("a model was built before the checkpoint was checked")


@pytest.fixture()
def nothing_built(monkeypatch):
    monkeypatch.setattr(huggingface, "LlamaMistralTransformer", NeverBuilt)
    monkeypatch.setattr(huggingface_gpt2, "DecoderOnlyTransformer", NeverBuilt)


def rejected(directory: Path, *fragments: str) -> str:
    """load_huggingface(directory) raises a ValueError containing every fragment, and leaves
    the directory's files as they were."""
    before = snapshot(directory)
    with pytest.raises(ValueError) as caught:
        load_huggingface(directory)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert snapshot(directory) == before
    return message


# ---- the config against the tensors, before any model exists


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_tiny_checkpoint_loads(tmp_path, family):
    """The test checkpoints are right: each family's loads (so the errors below are the
    config's alone)."""
    with load_huggingface(family_checkpoint(tmp_path, family)) as loaded:
        assert loaded.architecture == family
        assert loaded.model.config.block_count == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_a_million_layers_over_two_layers_of_tensors_fail_before_building(tmp_path,
                                                                         nothing_built, family):
    family_checkpoint(tmp_path, family, num_hidden_layers=1_000_000)
    message = rejected(tmp_path, "num_hidden_layers 1000000",
                       str(tmp_path / "model.safetensors"), "2 layer(s)")
    assert message.startswith(str(tmp_path / "config.json"))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vocab_size_of_2_to_the_28_fails_naming_it_before_building(tmp_path, nothing_built,
                                                                    family):
    family_checkpoint(tmp_path, family, vocab_size=2 ** 28)
    message = rejected(tmp_path, "tensor 'model.embed_tokens.weight' has shape [260, 16]",
                       "the config needs [268435456, 16]",
                       f"{tmp_path / 'config.json'}: vocab_size 268435456 vs the tensor's 260")
    assert message.startswith(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("family, changes, fragment", [
    ("llama", dict(num_hidden_layers=1), "num_hidden_layers 1 disagrees"),
    ("llama", dict(num_hidden_layers=3), "num_hidden_layers 3 disagrees"),
    ("llama", dict(intermediate_size=32), "intermediate_size 32 vs the tensor's 24"),
    ("llama", dict(hidden_size=32, num_attention_heads=8),
     "hidden_size 32 vs the tensor's 16"),
    ("llama", dict(num_key_value_heads=4),
     "num_key_value_heads * hidden_size / num_attention_heads 16 vs the tensor's 8"),
    ("qwen3", dict(head_dim=8), "num_attention_heads * head_dim 32 vs the tensor's 24"),
    ("gemma2", dict(head_dim=None), "num_attention_heads * head_dim 1024 vs the tensor's 16"),
    ("gemma3", dict(head_dim=None), "num_attention_heads * head_dim 1024 vs the tensor's 16"),
    ("phi3", dict(intermediate_size=20), "2 * intermediate_size 40 vs the tensor's 48"),
    ("llama", dict(tie_word_embeddings=True), "'lm_head.weight' differs from"),
])
def test_each_config_field_the_tensors_contradict_is_named(tmp_path, nothing_built, family,
                                                          changes, fragment):
    family_checkpoint(tmp_path, family, **changes)
    rejected(tmp_path, fragment)


def test_a_gemma2_config_over_gemma3_tensors_names_the_qk_norm(tmp_path, nothing_built):
    """Gemma 2's tensors are Gemma 3's without QK-norm: a Gemma 3 checkpoint under a Gemma 2
    config.json is refused naming the first tensor Gemma 2 does not have."""
    family_checkpoint(tmp_path, "gemma3", architectures=["Gemma2ForCausalLM"])
    message = rejected(tmp_path, "unexpected tensor 'model.layers.0.self_attn.",
                       "_norm.weight' (not a parameter of a tied gemma2 model)")
    assert message.startswith(str(tmp_path / "model.safetensors"))


def test_a_sharded_checkpoints_layer_count_is_checked_against_its_index(tmp_path,
                                                                        nothing_built):
    base = {**CONFIG, "num_hidden_layers": 2}
    generator = random.Random(3)
    tensors = {name: ("F32", shape, random_f32(shape, generator))
               for name, shape in family_shapes("llama", base).items()}
    names = list(tensors)
    weight_map = {}
    for shard, part in enumerate((names[::2], names[1::2])):
        file = f"model-{shard + 1}-of-2.safetensors"
        (tmp_path / file).write_bytes(safetensors_bytes({n: tensors[n] for n in part}))
        weight_map.update({n: file for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_config(tmp_path, num_hidden_layers=1_000_000)
    write_tokenizer(tmp_path)
    rejected(tmp_path, "num_hidden_layers 1000000 disagrees with "
                       f"{tmp_path / 'model.safetensors.index.json'}", "2 layer(s)")


def test_gpt2_layers_and_vocabulary_are_checked_before_building(tmp_path, nothing_built):
    message = rejected(gpt2_hand_built(tmp_path / "layers", n_layer=1_000_000),
                       "n_layer 1000000 disagrees with", "2 layer(s)")
    assert message.startswith(str(tmp_path / "layers" / "config.json"))
    rejected(gpt2_hand_built(tmp_path / "vocabulary", vocab_size=2 ** 28),
             "tensor 'transformer.wte.weight' has shape [258, 16]",
             "vocab_size 268435456 vs the tensor's 258")
    rejected(gpt2_hand_built(tmp_path / "positions", n_positions=2 ** 20),
             "n_positions 1048576 vs the tensor's 12")
    rejected(gpt2_hand_built(tmp_path / "inner", n_inner=4096), "n_inner 4096 vs the tensor's 64")


# ---- config.json: strict JSON, typed fields


@pytest.mark.parametrize("text, fragment", [
    (json.dumps(CONFIG)[:-1] + ', "vocab_size": 7}', "duplicate key 'vocab_size'"),
    ('{"architectures": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    (json.dumps({**CONFIG, "architectures": [{}]}), "architectures [{}] is not supported"),
    (json.dumps({**CONFIG, "use_sliding_window": "false"}),
     "use_sliding_window must be true, false or null, not a string ('false')"),
    (json.dumps(CONFIG).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e400'),
     "rms_norm_eps must be a positive finite number"),
    (json.dumps({**CONFIG, "num_key_value_heads": 3}),
     "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
], ids=["duplicate key", "nested too deeply", "architecture not text", "flag as text",
        "infinite epsilon", "key/value heads"])
def test_config_json_defects_name_the_file_and_field(tmp_path, nothing_built, text, fragment):
    family_checkpoint(tmp_path, "llama")
    (tmp_path / "config.json").write_text(text)
    message = rejected(tmp_path, fragment)
    assert message.startswith(str(tmp_path / "config.json"))


def test_gpt2_activation_of_the_wrong_type_names_the_key(tmp_path, nothing_built):
    rejected(gpt2_hand_built(tmp_path, activation_function=[]),
             "activation_function [] is not supported")


def test_a_chat_template_list_with_odd_names_is_read_without_a_type_error(tmp_path):
    family_checkpoint(tmp_path, "llama")
    template = "{{ '<|im_start|>' }}"
    write_tokenizer(tmp_path, {"chat_template": [{"name": ["x"], "template": "a"},
                                                 {"name": "default", "template": template}]})
    with load_huggingface(tmp_path) as loaded:
        assert loaded.chat_template.text == template


# ---- tokenizer.json


def tokenizer_document() -> dict:
    """The byte-level tokenizer.json of test_huggingface_import (256 byte tokens, <s> 256 and
    </s> 257 added), with the merge "h e" -> "he" (258)."""
    vocab = {character: byte for byte, character in enumerate(byte_level_alphabet())}
    vocab["he"] = 258
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": 256, "content": "<s>", "special": True},
            {"id": 257, "content": "</s>", "special": True},
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h e"]},
        "decoder": {"type": "ByteLevel"},
    }


def edited(change) -> dict:
    document = tokenizer_document()
    change(document)
    return document


def vocab(document: dict) -> dict:
    return document["model"]["vocab"]


# Each defect: the document's text, and what the error must say after the file's path.
TOKENIZER_DEFECTS = {
    "negative vocab id": (edited(lambda d: vocab(d).update({"zz": -1})),
                          "model.vocab['zz'] must be a token id", "a number (-1)"),
    "repeated vocab id": (edited(lambda d: vocab(d).update({"zz": 104})),
                          "model.vocab['zz'] = 104 repeats the id of model.vocab['h']"),
    "vocab id as text": (edited(lambda d: vocab(d).update({"zz": "7"})),
                         "model.vocab['zz'] must be a token id", "a string ('7')"),
    "huge vocab id": (edited(lambda d: vocab(d).update({"zz": 4_000_000_000})),
                      "leave token ids [259] without a token", "ids up to 4000000000"),
    "gap in the ids": (edited(lambda d: vocab(d).update({"zz": 300})),
                       "leave token ids [259] without a token"),
    "added token over another vocab token":
        (edited(lambda d: d["added_tokens"].append({"id": 104, "content": "<x>"})),
         "added_tokens[2] gives id 104 to '<x>', but model.vocab gives it to 'h'"),
    "added token repeating a vocab text at another id":
        (edited(lambda d: d["added_tokens"].append({"id": 259, "content": "he"})),
         "added_tokens[2] gives 'he' id 259, but model.vocab gives it id 258"),
    "repeated added id": (edited(lambda d: d["added_tokens"].append({"id": 257,
                                                                     "content": "<x>"})),
                          "added_tokens[2].id 257 repeats added_tokens[1].id"),
    "repeated added text": (edited(lambda d: d["added_tokens"].append({"id": 259,
                                                                       "content": "</s>"})),
                            "added_tokens[2].content '</s>' repeats added_tokens[1].content"),
    "negative added id": (edited(lambda d: d["added_tokens"].append({"id": -2,
                                                                     "content": "<x>"})),
                          "added_tokens[2].id must be a token id", "a number (-2)"),
    "added id as text": (edited(lambda d: d["added_tokens"].__setitem__(0, {"id": "256",
                                                                           "content": "<s>"})),
                         "added_tokens[0].id must be a token id", "a string ('256')"),
    "added token without id": (edited(lambda d: d["added_tokens"][0].pop("id")),
                               "added_tokens[0].id must be a token id", "not null"),
    "added content not text": (edited(lambda d: d["added_tokens"][0].update(content=5)),
                               "added_tokens[0].content must be a string"),
    "added special not a bool": (edited(lambda d: d["added_tokens"][0].update(special="yes")),
                                 "added_tokens[0].special must be true or false"),
    "added_tokens not a list": (edited(lambda d: d.update(added_tokens={"id": 1})),
                                "added_tokens must be an array, not an object"),
    "added entry not an object": (edited(lambda d: d["added_tokens"].append(5)),
                                  "added_tokens[2] must be an object"),
    "vocab not an object": (edited(lambda d: d["model"].update(vocab=[["a", 1]])),
                            "model.vocab must be an object, not an array"),
    "empty token": (edited(lambda d: vocab(d).update({"": 259})), "model.vocab[''] is empty"),
    "merge without a space": (edited(lambda d: d["model"].update(merges=["he"])),
                              "model.merges[0] 'he' is not \"left right\""),
    "merge of three": (edited(lambda d: d["model"].update(merges=["h e x"])),
                       "model.merges[0] 'h e x' is not \"left right\""),
    "merge pair of one": (edited(lambda d: d["model"].update(merges=[["h"]])),
                          "model.merges[0] must be two non-empty strings"),
    "merge not text": (edited(lambda d: d["model"].update(merges=[5])),
                       "model.merges[0] must be a string \"left right\" or an array"),
    "merge outside the vocab": (edited(lambda d: d["model"].update(merges=["h e", "e h"])),
                                "model.merges[1] 'e h': its merged token 'eh' is not in "
                                "model.vocab"),
    "repeated merge": (edited(lambda d: d["model"].update(merges=["h e", ["h", "e"]])),
                       "model.merges[1] ['h', 'e'] repeats model.merges[0]"),
    "merges not a list": (edited(lambda d: d["model"].update(merges="h e")),
                          "model.merges must be an array"),
    "pre_tokenizer not an object": (edited(lambda d: d.update(pre_tokenizer="ByteLevel")),
                                    "pre_tokenizer must be an object, not a string"),
    "pre-tokenizer stage not an object":
        (edited(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [1]})),
         "pre_tokenizer.pretokenizers[0] must be an object"),
    "pre-tokenizer stage without a type":
        (edited(lambda d: d.update(pre_tokenizer={"type": "Sequence",
                                                  "pretokenizers": [{"kind": "ByteLevel"}]})),
         "pre_tokenizer.pretokenizers[0].type must be a string, not null"),
    "Split pattern not an object":
        (edited(lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": "x"}, {"type": "ByteLevel"}]})),
         "pre_tokenizer.pretokenizers[0].pattern must be an object"),
    "byte_fallback not a bool": (edited(lambda d: d["model"].update(byte_fallback="true")),
                                 "model.byte_fallback must be true or false"),
    "model not an object": (edited(lambda d: d.update(model="BPE")),
                            "model must be an object, not a string"),
    "not an object": ([1, 2], "the document must be a JSON object, not an array"),
}


def written(path: Path, document) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("defect", TOKENIZER_DEFECTS)
def test_each_tokenizer_json_defect_is_a_value_error_naming_file_and_path(tmp_path, defect):
    document, *fragments = TOKENIZER_DEFECTS[defect]
    path = written(tmp_path / "tokenizer.json", document)
    before = path.read_bytes()
    with pytest.raises(ValueError) as caught:
        PretrainedTokenizer.from_tokenizer_json(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    assert path.read_bytes() == before


def test_the_unchanged_test_tokenizer_loads(tmp_path):
    path = written(tmp_path / "tokenizer.json", tokenizer_document())
    with PretrainedTokenizer.from_tokenizer_json(path) as tokenizer:
        assert tokenizer.vocabulary_size == 259
        assert tokenizer.encode("he</s>") == [258, 257]


def test_duplicate_keys_in_tokenizer_json_are_refused_not_last_wins(tmp_path):
    # Python's json would keep the second "h", making id 104 tokenless and "h" id 7.
    text = json.dumps(tokenizer_document()).replace('"h": 104', '"h": 104, "h": 7')
    path = written(tmp_path / "tokenizer.json", text)
    with pytest.raises(ValueError, match=r"tokenizer\.json: invalid JSON: duplicate key 'h'"):
        PretrainedTokenizer.from_tokenizer_json(path)
    text = json.dumps(tokenizer_document())[:-1] + ', "model": {"type": "BPE"}}'
    written(path, text)
    with pytest.raises(ValueError, match="duplicate key 'model'"):
        PretrainedTokenizer.from_tokenizer_json(path)


def test_deeply_nested_tokenizer_json_is_malformed_not_a_recursion_error(tmp_path):
    path = written(tmp_path / "tokenizer.json",
                   '{"normalizer": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match=f"^{path}: JSON nested too deeply$"):
        PretrainedTokenizer.from_tokenizer_json(path)


def test_a_lone_surrogate_in_a_token_is_named(tmp_path):
    text = json.dumps(tokenizer_document()).replace('"he": 258', '"he": 258, "\\ud800x": 259')
    path = written(tmp_path / "tokenizer.json", text)
    with pytest.raises(ValueError, match=r"model\.vocab\['\\ud800x'\] .* lone surrogate"):
        PretrainedTokenizer.from_tokenizer_json(path)


def test_a_byte_level_token_outside_the_alphabet_names_the_file(tmp_path):
    """What the library still refuses comes back as a ValueError naming the file."""
    path = written(tmp_path / "tokenizer.json",
                   edited(lambda d: vocab(d).update({"\u2581x": 259})))
    with pytest.raises(ValueError, match=f"^{path}: the vocabulary is refused: .*tokens\\[259\\]"):
        PretrainedTokenizer.from_tokenizer_json(path)


def test_added_tokens_repeating_vocab_entries_load_as_real_files_write_them(tmp_path):
    """GPT-2's, Llama 2's and Gemma's files list special tokens both in model.vocab and in
    added_tokens, with the same id and text: that loads, the entry typed as special."""
    document = edited(lambda d: (vocab(d).update({"<|endoftext|>": 259}),
                                 d["added_tokens"].append({"id": 259, "content": "<|endoftext|>",
                                                           "special": True})))
    path = written(tmp_path / "tokenizer.json", document)
    with PretrainedTokenizer.from_tokenizer_json(path) as tokenizer:
        assert tokenizer.vocabulary_size == 260
        assert tokenizer.encode("he<|endoftext|>") == [258, 259]
        assert tokenizer.encode("<|endoftext|>", special=False) != [259]


def test_a_tokenizer_json_defect_through_the_directory_closes_the_model(tmp_path,
                                                                        monkeypatch):
    created = []

    class Recording(huggingface.LlamaMistralTransformer):
        def __init__(self, *arguments, **keywords):
            super().__init__(*arguments, **keywords)
            created.append(self)

    monkeypatch.setattr(huggingface, "LlamaMistralTransformer", Recording)
    family_checkpoint(tmp_path, "llama")
    written(tmp_path / "tokenizer.json", TOKENIZER_DEFECTS["repeated vocab id"][0])
    message = rejected(tmp_path, "repeats the id of model.vocab['h']")
    assert message.startswith(str(tmp_path / "tokenizer.json"))
    assert created and all(model.closed for model in created)


ORACLE_TOKENIZER = r"""
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
vocab = {symbol: index for index, symbol in enumerate(alphabet)}
vocab.update({"he": 256, "ll": 257, "hell": 258, "<|endoftext|>": 259})
tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("h", "e"), ("l", "l"), ("he", "ll")]))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
# One special token already in the vocabulary (its entry is repeated), one new.
tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>"])
tokenizer.save(sys.argv[1])
text = "hello<|im_start|>hell<|endoftext|>"
print(json.dumps(tokenizer.encode(text).ids))
"""


def test_a_tokenizer_json_the_tokenizers_package_writes_loads_to_its_ids(tmp_path):
    python = oracle_python("tokenizers")
    path = tmp_path / "tokenizer.json"
    completed = subprocess.run([python, "-c", ORACLE_TOKENIZER, str(path)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    document = json.loads(path.read_text(encoding="utf-8"))
    repeated = [t for t in document["added_tokens"] if t["content"] in document["model"]["vocab"]]
    assert [(t["id"], t["content"]) for t in repeated] == [(259, "<|endoftext|>")]
    with PretrainedTokenizer.from_tokenizer_json(path) as tokenizer:
        assert tokenizer.encode("hello<|im_start|>hell<|endoftext|>") == \
            json.loads(completed.stdout)
