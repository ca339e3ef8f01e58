#!/usr/bin/env python3
"""Writes a GGUF v3 file (architecture ``gpt2``) with RANDOM F32 weights, for benchmarking
llama.cpp beside riftco-transformer on the same model shape.

Shapes (``--config``, default ``gpt2``), matching the benchmarks' configs:

    name   vocab  context  width  heads  blocks  ffn
    tiny     256      128    128      4       4   512
    small   8192      256    512      8       6  2048
    gpt2   50257     1024    768     12      12  3072   (GPT-2-124M)

Layer-norm epsilon 1e-5. Every tensor is F32 (embeddings, norms and biases included) and
``general.file_type`` is 0 (ALL_F32), so llama-bench reports the model as "all F32". The
output head is UNTIED (its own random matrix, as in our model), so the gpt2 config holds
124,439,808 parameters plus 38,597,376 for the head = 163,037,184 (622 MiB of
tensors, about 624 MiB on disk with the vocabulary).

Initialisation: linear and embedding weights N(0, 0.02), biases 0, layer-norm gains 1 and
biases 0 — the values only matter for speed, never for quality.

Tokenizer: llama.cpp will not load a model without one, so the file carries a synthetic
byte-level BPE vocabulary of exactly ``vocab`` tokens (tokenizer.ggml.model "gpt2",
pre-tokenizer "gpt-2"): the 256 single-byte tokens under GPT-2's byte-to-unicode mapping,
then ``vocab - 257`` merged tokens, each the concatenation of two earlier tokens with its
merge rule ("left right") at the matching rank, and last the control token
``<|endoftext|>`` as BOS/EOS. The merges are pseudo-random (seeded) joins of letters
(weighted by English letter frequency), short digit runs, a leading capital and a leading
'Ġ' (GPT-2's space), pieces of at most 10 characters, so text splits into word-like
pieces; they are no real GPT-2 vocabulary. A vocabulary under 258 (tiny) keeps only the
first ``vocab - 2`` byte tokens (control bytes, the rarest, drop out) and one merge:
llama.cpp will not load a BPE vocabulary without merges.

Run it with the PyPI ``gguf`` package (which brings numpy) in its own venv:

    python3 -m venv ~/.cache/riftco-transformer/gguf-venv
    ~/.cache/riftco-transformer/gguf-venv/bin/pip install gguf numpy
    ~/.cache/riftco-transformer/gguf-venv/bin/python tools/make_gpt2_gguf.py \\
        [--config gpt2|small|tiny] [--output PATH] [--seed N]

Then, e.g.:  llama-bench -m ~/.cache/riftco-transformer/gpt2-124m-f32-random.gguf \\
                 -p 128 -n 128 -t 2 -o json

Tensor names and shapes follow llama.cpp's gpt2 architecture (numpy shapes below are
[rows, cols]; GGUF stores them reversed, ne0 first): token_embd [V, D], position_embd
[C, D], per block N: attn_norm.{weight,bias} [D], attn_qkv.weight [3D, D] (fused Q, K, V)
and .bias [3D], attn_output.weight [D, D] and .bias [D], ffn_norm.{weight,bias} [D],
ffn_up.weight [F, D] and .bias [F], ffn_down.weight [D, F] and .bias [D]; then
output_norm.{weight,bias} [D] and output.weight [V, D].
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

CONFIGS = {
    #        V      C     D   H   N     F
    "tiny": (256, 128, 128, 4, 4, 512),
    "small": (8192, 256, 512, 8, 6, 2048),
    "gpt2": (50257, 1024, 768, 12, 12, 3072),
}
LAYER_NORM_EPS = 1e-5
INIT_STD = 0.02
EOT = "<|endoftext|>"
DEFAULT_OUTPUT = "~/.cache/riftco-transformer/gpt2-124m-f32-random.gguf"


def byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table as a list: entry b is the printable character that
    stands for byte b. Bytes that are printable (and not space) stand for themselves; the
    rest take code points from 256 upwards in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1))
                 + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def synthetic_vocab(n_vocab: int, seed: int) -> tuple[list[str], list[int], list[str]]:
    """Returns (tokens, token_types, merges) for a byte-level BPE vocabulary of exactly
    n_vocab tokens, the last being <|endoftext|>. Merge i makes token n_base + i out of two
    tokens of lower id (n_base = 256 byte tokens, fewer for a tiny vocabulary); every
    token string is distinct."""
    if n_vocab < 100:
        raise ValueError("vocabulary must hold at least 100 tokens (letters and digits)")
    chars = byte_chars()
    # Base tokens in the mapped characters' order (printable first, as GPT-2 lists them),
    # so a vocabulary under 258 drops the control bytes and soft hyphen first. At least
    # one merge is kept: llama.cpp refuses a BPE vocabulary without tokenizer.ggml.merges
    # (and the gguf writer drops an empty array).
    base = sorted(chars, key=ord)[: min(256, n_vocab - 2)]
    tokens: list[str] = list(base)
    known = set(tokens)
    merges: list[str] = []
    n_merges = n_vocab - 1 - len(tokens)

    rng = random.Random(seed)
    space = chars[ord(" ")]  # 'Ġ', GPT-2's stand-in for a leading space
    # English letter frequencies (percent, roughly) so merged pieces look like word parts.
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8,
               2.4, 2.4, 2.2, 2.0, 2.0, 1.9, 1.5, 1.0, 0.8, 0.2, 0.2, 0.1, 0.1]
    lower = [c for c in letters if c in known]
    upper = [c.upper() for c in letters if c.upper() in known]
    digits = [c for c in "0123456789" if c in known]
    # Merges only join word pieces: a lowercase run, optionally led by a capital and/or by
    # 'Ġ'; or a digit run. Lowercase-led pieces are the only ones joined on the right, so
    # 'Ġ' and capitals only ever lead a token (GPT-2's pre-tokenizer splits before them).
    pieces = ([space] if space in known else []) + lower + upper  # may stand on the left
    tails = list(lower)                                           # may stand on the right
    numbers = list(digits)
    max_len = 10
    while len(merges) < n_merges and lower:
        r = rng.random()
        if r < 0.55:
            left, right = rng.choice(pieces), rng.choices(letters, weights)[0]  # grow by a letter
        elif r < 0.7:
            left, right = space, rng.choice(tails if rng.random() < 0.8 else upper)  # word start
        elif r < 0.97:
            left, right = rng.choice(pieces), rng.choice(tails)  # join two pieces
        elif numbers:
            left, right = rng.choice(numbers), rng.choice(digits)  # digit runs, short
            if len(left) >= 3:
                continue
        else:
            continue
        if left not in known or right not in known or left == space == right:
            continue
        new = left + right
        if len(new) > max_len or new in known:
            continue
        merges.append(f"{left} {right}")
        tokens.append(new)
        known.add(new)
        if new[-1].isdigit():
            numbers.append(new)
        else:
            pieces.append(new)
            if new[0].islower():
                tails.append(new)
    if len(merges) < n_merges:
        raise ValueError("vocabulary too small for merges (needs the letter bytes)")

    tokens.append(EOT)
    token_types = [1] * (len(tokens) - 1) + [3]  # NORMAL ..., CONTROL for <|endoftext|>
    assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
    return tokens, token_types, merges


def tensor_specs(V: int, C: int, D: int, N: int, F: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, init) in file order; init is 'normal', 'ones' or 'zeros'."""
    specs = [("token_embd.weight", (V, D), "normal"),
             ("position_embd.weight", (C, D), "normal")]
    for i in range(N):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (D,), "ones"),
            (b + "attn_norm.bias", (D,), "zeros"),
            (b + "attn_qkv.weight", (3 * D, D), "normal"),
            (b + "attn_qkv.bias", (3 * D,), "zeros"),
            (b + "attn_output.weight", (D, D), "normal"),
            (b + "attn_output.bias", (D,), "zeros"),
            (b + "ffn_norm.weight", (D,), "ones"),
            (b + "ffn_norm.bias", (D,), "zeros"),
            (b + "ffn_up.weight", (F, D), "normal"),
            (b + "ffn_up.bias", (F,), "zeros"),
            (b + "ffn_down.weight", (D, F), "normal"),
            (b + "ffn_down.bias", (D,), "zeros"),
        ]
    specs += [("output_norm.weight", (D,), "ones"),
              ("output_norm.bias", (D,), "zeros"),
              ("output.weight", (V, D), "normal")]  # untied head
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="gpt2")
    parser.add_argument("--output", default=None,
                        help=f"GGUF path (default for gpt2: {DEFAULT_OUTPUT}; for the others "
                             "the same folder, named <config>-f32-random.gguf)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        import numpy as np
        import gguf
    except ImportError as e:
        print(f"error: {e}; run this with the venv that has the PyPI 'gguf' package "
              "(see the docstring)", file=sys.stderr)
        return 2

    V, C, D, H, N, F = CONFIGS[args.config]
    if D % H:
        raise SystemExit("width must be a multiple of the head count")
    if args.output is None:
        out = DEFAULT_OUTPUT if args.config == "gpt2" else \
            str(Path(DEFAULT_OUTPUT).parent / f"{args.config}-f32-random.gguf")
    else:
        out = args.output
    path = Path(os.path.expanduser(out))
    path.parent.mkdir(parents=True, exist_ok=True)

    tokens, token_types, merges = synthetic_vocab(V, args.seed)
    specs = tensor_specs(V, C, D, N, F)
    n_params = sum(int(np.prod(s)) for _, s, _ in specs)

    w = gguf.GGUFWriter(str(path), "gpt2")  # writes general.architecture
    w.add_name(f"riftco {args.config} random F32 (seed {args.seed})")
    w.add_description("random weights of a GPT-2-shaped model, for speed benchmarks only")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_vocab_size(V)
    w.add_context_length(C)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_block_count(N)
    w.add_head_count(H)
    w.add_layer_norm_eps(LAYER_NORM_EPS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(V - 1)
    w.add_eos_token_id(V - 1)
    w.add_add_bos_token(False)  # GPT-2 prepends nothing

    # Tensor infos first, then the data one tensor at a time, so memory stays at one tensor.
    for name, shape, _ in specs:
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for name, shape, init in specs:
        if init == "normal":
            t = rng.standard_normal(shape, dtype=np.float32)
            t *= np.float32(INIT_STD)
        elif init == "ones":
            t = np.ones(shape, dtype=np.float32)
        else:
            t = np.zeros(shape, dtype=np.float32)
        w.write_tensor_data(t)
    w.close()

    size = path.stat().st_size
    print(f"wrote {path}: config {args.config} (V={V} C={C} D={D} H={H} N={N} F={F}), "
          f"{n_params:,} parameters ({n_params - V * D:,} without the untied head), "
          f"{len(tokens)} tokens, {len(merges)} merges, all F32, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
