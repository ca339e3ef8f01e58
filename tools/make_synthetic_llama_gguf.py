#!/usr/bin/env python3
"""Writes a GGUF v3 file of architecture ``llama`` in the real shapes of a larger model, with
RANDOM Q4_0 (or Q8_0) weights, for memory and speed benchmarks of ``weights="file"`` beside
llama.cpp. The values only matter for speed and memory, never for quality. Write it OUTSIDE
the repository (the default is ~/.cache/riftco-transformer/models/); never commit it.

Shapes (``--shape``):

    name        vocab  context  width  heads  kv heads  blocks    ffn   file (Q4_0)
    llama2-7b   32000     4096   4096     32        32      32  11008   about 3.8 GB
    llama2-13b  32000     4096   5120     40        40      40  13824   about 7.4 GB
    tiny          512      256    256      4         2       2    512   (for the tools' test)

Every matrix (token embedding and head included) is in the chosen block format; the norms are
F32 ones. A Q4_0 block gets a binary16 scale d of 0.0016-0.0031 and random codes, so every
weight is within about ±0.025; to write gigabytes quickly the blocks come from a 4 MiB pool of
random blocks written at rotating offsets (each tensor reads as random, and its bytes are all
streamed through at decode time like any other file's).

The tokenizer is a synthetic SentencePiece-style vocabulary (tokenizer.ggml.model "llama"):
<unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁t<i>" pieces up to the vocabulary
size, so that llama.cpp (llama-bench) and our loader both accept the file.

    python3 tools/make_synthetic_llama_gguf.py [--shape llama2-7b] [--type q4_0|q8_0] \\
        [--output PATH] [--seed N]

Standard library only.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
from pathlib import Path

SHAPES = {
    "llama2-7b": dict(vocab=32000, context=4096, width=4096, heads=32, kv_heads=32, blocks=32,
                      ffn=11008),
    "llama2-13b": dict(vocab=32000, context=4096, width=5120, heads=40, kv_heads=40, blocks=40,
                       ffn=13824),
    "tiny": dict(vocab=512, context=256, width=256, heads=4, kv_heads=2, blocks=2, ffn=512),
}
# ggml types and llama_ftype of each block format.
TYPES = {"q4_0": (2, 18, 2), "q8_0": (8, 34, 7)}  # (ggml type, bytes per 32, general.file_type)
F32 = 0
ALIGNMENT = 32
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 8, 9
POOL_BYTES = 4 << 20


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def key_value(key: str, kind: int, value) -> bytes:
    out = string(key) + struct.pack("<I", kind)
    if kind == GGUF_UINT32:
        return out + struct.pack("<I", value)
    if kind == GGUF_INT32:
        return out + struct.pack("<i", value)
    if kind == GGUF_FLOAT32:
        return out + struct.pack("<f", value)
    if kind == GGUF_STRING:
        return out + string(value)
    element, values = value
    out += struct.pack("<IQ", element, len(values))
    if element == GGUF_STRING:
        return out + b"".join(string(v) for v in values)
    code = {GGUF_INT32: "i", GGUF_FLOAT32: "f"}[element]
    return out + struct.pack(f"<{len(values)}{code}", *values)


def metadata(shape: dict, file_type: int, name: str) -> list[bytes]:
    width, heads = shape["width"], shape["heads"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(shape["vocab"] - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (shape["vocab"] - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(shape["vocab"] - 259)]
    return [
        key_value("general.architecture", GGUF_STRING, "llama"),
        key_value("general.name", GGUF_STRING, name),
        key_value("general.file_type", GGUF_UINT32, file_type),
        key_value("general.quantization_version", GGUF_UINT32, 2),
        key_value("llama.context_length", GGUF_UINT32, shape["context"]),
        key_value("llama.embedding_length", GGUF_UINT32, width),
        key_value("llama.block_count", GGUF_UINT32, shape["blocks"]),
        key_value("llama.feed_forward_length", GGUF_UINT32, shape["ffn"]),
        key_value("llama.rope.dimension_count", GGUF_UINT32, width // heads),
        key_value("llama.attention.head_count", GGUF_UINT32, heads),
        key_value("llama.attention.head_count_kv", GGUF_UINT32, shape["kv_heads"]),
        key_value("llama.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, 1e-5),
        key_value("llama.rope.freq_base", GGUF_FLOAT32, 10000.0),
        key_value("llama.vocab_size", GGUF_UINT32, shape["vocab"]),
        key_value("tokenizer.ggml.model", GGUF_STRING, "llama"),
        key_value("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        key_value("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_FLOAT32, scores)),
        key_value("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_INT32, types)),
        key_value("tokenizer.ggml.bos_token_id", GGUF_UINT32, 1),
        key_value("tokenizer.ggml.eos_token_id", GGUF_UINT32, 2),
        key_value("tokenizer.ggml.unknown_token_id", GGUF_UINT32, 0),
    ]


def tensors(shape: dict, block_type: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, dims innermost first, ggml type) in file order."""
    width, ffn, vocab = shape["width"], shape["ffn"], shape["vocab"]
    kv = width // shape["heads"] * shape["kv_heads"]
    out = [("token_embd.weight", (width, vocab), block_type)]
    for b in range(shape["blocks"]):
        out += [(f"blk.{b}.attn_norm.weight", (width,), F32),
                (f"blk.{b}.attn_q.weight", (width, width), block_type),
                (f"blk.{b}.attn_k.weight", (width, kv), block_type),
                (f"blk.{b}.attn_v.weight", (width, kv), block_type),
                (f"blk.{b}.attn_output.weight", (width, width), block_type),
                (f"blk.{b}.ffn_norm.weight", (width,), F32),
                (f"blk.{b}.ffn_gate.weight", (width, ffn), block_type),
                (f"blk.{b}.ffn_up.weight", (width, ffn), block_type),
                (f"blk.{b}.ffn_down.weight", (ffn, width), block_type)]
    out += [("output_norm.weight", (width,), F32), ("output.weight", (width, vocab), block_type)]
    return out


def block_pool(kind: str, seed: int) -> bytes:
    """POOL_BYTES of valid random blocks (whole blocks)."""
    _, size, _ = TYPES[kind]
    generator = random.Random(seed)
    count = POOL_BYTES // size
    codes = bytearray(generator.randbytes(count * size))
    for b in range(count):
        d = (0.0016 if kind == "q4_0" else 0.0002) * (1.0 + generator.random())
        struct.pack_into("<e", codes, b * size, d)
    return bytes(codes)


def size_of(dims: tuple[int, ...], kind: int) -> int:
    count = 1
    for d in dims:
        count *= d
    if kind == F32:
        return 4 * count
    size = next(block for code, block, _ in TYPES.values() if code == kind)
    return count // 32 * size


def aligned(position: int) -> int:
    return (position + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    parser.add_argument("--type", choices=sorted(TYPES), default="q4_0")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=7)
    arguments = parser.parse_args()
    shape = SHAPES[arguments.shape]
    block_type, _, file_type = TYPES[arguments.type]
    output = arguments.output or (Path.home() / ".cache" / "riftco-transformer" / "models" /
                                  f"synthetic-{arguments.shape}.{arguments.type.upper()}.gguf")
    repository = Path(__file__).resolve().parents[1]
    if repository in output.resolve().parents:
        parser.error(f"--output {output} is inside the repository: write it outside")
    plan = tensors(shape, block_type)
    entries = metadata(shape, file_type, f"synthetic {arguments.shape} ({arguments.type})")
    infos, offset = [], 0
    for name, dims, kind in plan:
        infos.append(string(name) + struct.pack("<I", len(dims)) +
                     struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))
        offset = aligned(offset + size_of(dims, kind))
    header = (b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(entries)) + b"".join(entries) +
              b"".join(infos))
    pool = block_pool(arguments.type, arguments.seed)
    pool_view = memoryview(pool + pool)  # a window of any start reads whole pool bytes
    _, block_size, _ = TYPES[arguments.type]
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".part")
    rotation = 0
    with open(partial, "wb") as stream:
        stream.write(header)
        stream.write(b"\0" * (aligned(len(header)) - len(header)))
        for index, (name, dims, kind) in enumerate(plan):
            size = size_of(dims, kind)
            if kind == F32:
                stream.write(struct.pack("<f", 1.0) * (size // 4))
            else:
                left = size
                while left:
                    start = rotation % (len(pool) // block_size) * block_size
                    chunk = min(left, len(pool))
                    stream.write(pool_view[start:start + chunk])
                    left -= chunk
                    rotation += 7919  # a prime number of blocks on for the next chunk
            stream.write(b"\0" * (aligned(size) - size))
            if index % 40 == 0:
                print(f"  {name} ...", file=sys.stderr)
    os.replace(partial, output)
    print(f"wrote {output} ({output.stat().st_size / 1e9:.2f} GB, {len(plan)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
