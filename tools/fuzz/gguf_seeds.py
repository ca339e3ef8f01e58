#!/usr/bin/env python3
"""Writes the seed corpus of the GGUF libFuzzer target (tools/fuzz/gguf_fuzzer.cpp).

    python3 tools/fuzz/gguf_seeds.py OUT_DIR

Every seed is a small, valid GGUF file (at most a few KiB, well under the fuzzer's
-max_len=65536), written with the standard library's struct only (no `gguf` package, no
numpy), so the corpus exists without the oracle venv:

- tensors_<TYPE>.gguf: one tensor of each ggml type the reader knows (all 34 ids, 1 to 4
  dims), the dequantizable ones with plausible scales;
- tensors_Q4_0_chunks.gguf: a Q4_0 tensor of two 65 536-element chunks (37 KB), which
  dequantize splits across OpenMP threads;
- tensors_all.gguf: every type in one file, general.alignment = 64, tensors out of offset
  order; tensors_v2.gguf: the same layout as a version-2 file;
- metadata_all.gguf: a value of each of the 13 metadata types and an array (empty and not)
  of each of the 12 element types, integers at the edges of their ranges;
- tokenizer_bpe_{smollm,gpt2,llama3}.gguf: a tiny byte-level BPE vocabulary
  (tokenizer.ggml.model "gpt2", pre "smollm"/"gpt-2"/"llama-bpe"): the 256 byte-level
  symbols (gpt2: all but 0x00-0x03, which are then dropped), merged words in English,
  German, Russian and Chinese with their merges, and control, unknown, user-defined and
  unused tokens, BOS/EOS ids and a chat template; the id fields use different integer
  widths (uint32, int32, uint64, uint8) because the getters accept any width;
- tokenizer_spm_bytes.gguf: a SentencePiece-style vocabulary (model "llama") with scores,
  <unk>/<s>/</s>, the 256 <0xXX> byte tokens and a user-defined token;
  tokenizer_spm_bytes_noprefix.gguf: the same with add_space_prefix false (the fuzzer's
  round-trip oracle applies to it); tokenizer_spm_unk.gguf: no byte tokens, an
  unknown_token_id and add_space_prefix false.

The output is deterministic (a seeded random.Random).
"""
from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

MAGIC = 0x46554747  # "GGUF" as a little-endian u32

# Metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                  BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml types: id -> (name, elements per block, bytes per block), as gguf_reader.cpp's table.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
HALF_0_01 = 0x211F  # binary16 of about 0.01: a scale that keeps dequantized values small


# ---- The writer.

def gguf_string(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def gguf_value(value_type: int, value) -> bytes:
    if value_type == STR:
        return gguf_string(value)
    if value_type == ARR:
        element_type, items = value
        return struct.pack("<IQ", element_type, len(items)) + b"".join(
            gguf_value(element_type, item) for item in items)
    return struct.pack(SCALAR_FORMATS[value_type], value)


def gguf_file(metadata: list[tuple[str, int, object]],
              tensors: list[tuple[str, list[int], int, bytes]] = (), *, version: int = 3,
              order: list[int] | None = None) -> bytes:
    """metadata: (key, value type, value); tensors: (name, dims (ne0 first), ggml type, data).
    The data section holds the tensors in `order` (default: file order), each aligned."""
    alignment = next((value for key, kind, value in metadata
                      if key == "general.alignment" and kind == U32), 32)
    out = struct.pack("<IIQQ", MAGIC, version, len(tensors), len(metadata))
    for key, value_type, value in metadata:
        out += gguf_string(key) + struct.pack("<I", value_type) + gguf_value(value_type, value)
    offsets = [0] * len(tensors)
    data = b""
    for index in (order if order is not None else range(len(tensors))):
        data += b"\0" * (-len(data) % alignment)
        offsets[index] = len(data)
        data += tensors[index][3]
    for (name, dims, ggml_type, _), offset in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(dims))
        out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return out + data


# ---- Tensors.

def tensor_data(rng: random.Random, ggml_type: int, elements: int) -> bytes:
    _, block_elements, block_bytes = GGML_TYPES[ggml_type]
    blocks = elements // block_elements
    if ggml_type == 0:
        return struct.pack(f"<{elements}f", *(rng.uniform(-2, 2) for _ in range(elements)))
    if ggml_type == 28:
        return struct.pack(f"<{elements}d", *(rng.uniform(-2, 2) for _ in range(elements)))
    data = bytearray(rng.randbytes(blocks * block_bytes))
    half = struct.pack("<H", HALF_0_01)
    for b in range(blocks):
        at = b * block_bytes
        if ggml_type in (2, 3, 8, 12, 13):  # Q4_0, Q4_1, Q8_0: d first; Q4_K, Q5_K: d, dmin
            data[at:at + 2] = half
            if ggml_type in (3, 12, 13):
                data[at + 2:at + 4] = half
        elif ggml_type == 14:  # Q6_K: d last
            data[at + 208:at + 210] = half
    if ggml_type == 1:  # F16: finite values (exponent below 31)
        for i in range(elements):
            data[2 * i + 1] &= 0x7B
    return bytes(data)


def tensor_seeds(rng: random.Random) -> dict[str, bytes]:
    seeds = {}
    shapes = ([2], [2, 3], [1, 2, 2], [1, 1, 2, 1])
    everything = []
    for index, (ggml_type, (name, block_elements, _)) in enumerate(sorted(GGML_TYPES.items())):
        shape = shapes[index % len(shapes)]
        dims = [block_elements * shape[0]] + shape[1:]
        elements = 1
        for dim in dims:
            elements *= dim
        data = tensor_data(rng, ggml_type, elements)
        seeds[f"tensors_{name}.gguf"] = gguf_file(
            [("general.architecture", STR, "fuzz"), ("general.name", STR, name)],
            [(f"blk.0.{name.lower()}.weight", dims, ggml_type, data)])
        everything.append((f"t{index}.{name}", [block_elements], ggml_type,
                           tensor_data(rng, ggml_type, block_elements)))
    order = list(range(len(everything)))
    rng.shuffle(order)
    seeds["tensors_all.gguf"] = gguf_file(
        [("general.alignment", U32, 64), ("general.architecture", STR, "fuzz")], everything,
        order=order)
    # Q4_0 of 65 664 elements: two 65 536-element chunks, the dequantizer's parallel loop.
    seeds["tensors_Q4_0_chunks.gguf"] = gguf_file(
        [("general.architecture", STR, "fuzz")],
        [("token_embd.weight", [128, 513], 2, tensor_data(rng, 2, 128 * 513))])
    seeds["tensors_v2.gguf"] = gguf_file([("general.architecture", STR, "fuzz")],
                                         everything[:12], version=2)
    return seeds


# ---- Metadata of every type.

def metadata_seed() -> bytes:
    metadata = [
        ("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768),
        ("u32", U32, 4294967295), ("i32", I32, -2147483648), ("f32", F32, -1.5),
        ("bool.true", BOOL, True), ("bool.false", BOOL, False), ("str", STR, "grüße 世界"),
        ("str.empty", STR, ""), ("u64", U64, 2**64 - 1), ("i64", I64, -(2**63)),
        ("f64", F64, 1e300), ("i32.small", I32, 7), ("u64.small", U64, 42),
        ("f32.nan", F32, float("nan")), ("f64.inf", F64, float("-inf")),
    ]
    arrays = {U8: [0, 1, 255], I8: [-1, 0, 127], U16: [0, 65535], I16: [-32768, 5],
              U32: [0, 2**31, 2**32 - 1], I32: [-1, 2**31 - 1], F32: [0.5, -0.0, 3e38],
              BOOL: [True, False, True], STR: ["a", "", "Ġthe", "▁x"], U64: [1, 2**63],
              I64: [-(2**63), 2**31], F64: [1.0, -2.5e-300]}
    for element_type, items in arrays.items():
        metadata.append((f"array.{element_type}", ARR, (element_type, items)))
        metadata.append((f"array.{element_type}.empty", ARR, (element_type, [])))
    metadata.append(("general.alignment", U32, 32))
    return gguf_file(metadata, [("w", [4], 0, struct.pack("<4f", 1, -2, 3.5, 0))])


# ---- Tokenizers.

def byte_symbol(byte: int) -> str:
    """GPT-2's byte-level alphabet (PretrainedTokenizer's byte_level_symbol)."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if byte in printable:
        return chr(byte)
    return chr(0x100 + sum(1 for b in range(byte) if b not in printable))


def byte_level(text: str) -> str:
    return "".join(byte_symbol(b) for b in text.encode("utf-8"))


WORDS = [" the", "the", " hello", "Hello", " world", " wor", "ing", " in", "er", " and",
         "'s", " it", "42", "  ", "\n\n", " Grüße", " Привет", " мир", " 世界", "ü",
         " tokenizer", "<|"]
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_level_vocabulary(skip_bytes: range = range(0)):
    tokens = [byte_symbol(b) for b in range(256) if b not in skip_bytes]
    merges = []
    known = set(tokens)
    for word in WORDS:
        symbols = [byte_symbol(b) for b in word.encode("utf-8")]
        if any(symbol not in known for symbol in symbols):
            continue
        current = symbols[0]
        for symbol in symbols[1:]:
            merged = current + symbol
            if merged not in known:
                tokens.append(merged)
                known.add(merged)
                merges.append(f"{current} {symbol}")
            current = merged
    types = [1] * len(tokens)
    for text, token_type in (("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
                             ("<unk>", 2), ("<|tool|>", 4), ("<|unused_0|>", 5)):
        tokens.append(text)
        types.append(token_type)
    return tokens, types, merges


def bpe_seed(pre: str, id_type: int, type_type: int, skip_bytes: range = range(0)) -> bytes:
    tokens, types, merges = byte_level_vocabulary(skip_bytes)
    bos = tokens.index("<|im_start|>")
    eos = tokens.index("<|im_end|>")
    metadata = [
        ("general.architecture", STR, "llama"),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, pre),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (type_type, types)),
        ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.bos_token_id", id_type, bos),
        ("tokenizer.ggml.eos_token_id", id_type, eos),
        ("tokenizer.ggml.unknown_token_id", id_type, tokens.index("<unk>")),
        ("tokenizer.chat_template", STR, CHAT_TEMPLATE),
    ]
    return gguf_file(metadata, [("token_embd.weight", [4, 2], 0, struct.pack("<8f", *range(8)))])


def sentencepiece_seed(byte_tokens: bool, add_space_prefix: bool) -> bytes:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    if byte_tokens:
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [6] * 256
        scores += [0.0] * 256
    pieces = ["▁", "▁t", "he", "▁the", "▁h", "ll", "llo", "▁hello", "▁w", "or", "ld", "▁world",
              "▁▁", "in", "ing", "er", "世", "界", "世界", "ü", "▁grü", "ß", "e"]
    pieces += [chr(c) for c in range(ord("a"), ord("z") + 1) if chr(c) not in pieces]
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(rank) / 2)  # pairs of pieces share a score (a shared rank)
    tokens.append("<|user|>")
    types.append(4)
    scores.append(0.0)
    metadata = [
        ("general.architecture", STR, "llama"),
        ("tokenizer.ggml.model", STR, "llama"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.unknown_token_id", U32, 0),
        ("tokenizer.ggml.add_space_prefix", BOOL, add_space_prefix),
        ("tokenizer.chat_template", STR, "{{ bos_token }}[INST] {{ x }} [/INST]"),
    ]
    return gguf_file(metadata)


def all_seeds() -> dict[str, bytes]:
    rng = random.Random(20261202)
    seeds = tensor_seeds(rng)
    seeds["metadata_all.gguf"] = metadata_seed()
    seeds["tokenizer_bpe_smollm.gguf"] = bpe_seed("smollm", U32, I32)
    seeds["tokenizer_bpe_gpt2.gguf"] = bpe_seed("gpt-2", I32, U8, skip_bytes=range(0, 4))
    seeds["tokenizer_bpe_llama3.gguf"] = bpe_seed("llama-bpe", U64, I32)
    seeds["tokenizer_spm_bytes.gguf"] = sentencepiece_seed(byte_tokens=True, add_space_prefix=True)
    seeds["tokenizer_spm_bytes_noprefix.gguf"] = sentencepiece_seed(byte_tokens=True,
                                                                    add_space_prefix=False)
    seeds["tokenizer_spm_unk.gguf"] = sentencepiece_seed(byte_tokens=False, add_space_prefix=False)
    return seeds


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    seeds = all_seeds()
    for name, data in seeds.items():
        (out / name).write_bytes(data)
    largest = max(len(data) for data in seeds.values())
    print(f"wrote {len(seeds)} seeds to {out} (largest {largest} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
