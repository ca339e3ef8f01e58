"""Weights kept in GGUF block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K; issue 30):
``quantize_blocks`` writes ggml's blocks byte for byte (against this package's own exporter,
itself checked against a scalar transcription of ggml and ``gguf.quants.quantize``; and Q4_1
and Q5_0 against ``gguf.quants`` when the oracle interpreter has it);
``load_pretrained(weights="file")`` keeps a GGUF file's blocks for every rotary family with the
logits of the float32 load (the K formats and Q5_0 as random valid blocks written into a file,
decoded as ``gguf.quants.dequantize`` decodes them); the packed state round trips the blocks,
and every refusal names the argument and leaves the model unchanged. The real SmolLM2 Q4_1 file
is used when it is in the cache."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
import textwrap
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from support import oracle_python, smollm2_path
from test_decoder_families import DIMENSIONS, FAMILIES, forward_values, preset
from test_gguf_export import TYPE_CODE, capture, edge_case_blocks, run_cli

from riftco_transformer import (
    Adam,
    LlamaMistralConfig,
    LlamaMistralTransformer,
    LoraConfig,
    RiftcoTransformerError,
    cross_entropy,
    load_pretrained,
)
from riftco_transformer.interchange import export_gguf, gguf_export
from riftco_transformer.interchange.gguf_export import gguf_tensor_types
from riftco_transformer.native.pretrained_tokenizer import PretrainedTokenizer

BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
FORMAT_IDS = {"nf4": 0, "q8_0": 1, "q4_0": 2, "q4_1": 3}
# Every projection's input width a multiple of 32: width 32, 4 query heads of 8 (and 2 KV
# heads), feed-forward 64.
WIDE = dict(model_width=32, feed_forward_width=64, head_width=8)
TOKENS = [3, 17, 101, 250, 7, 64, 128, 9, 33, 200, 5, 42]


def wide_preset(architecture: str):
    return LlamaMistralConfig.preset(architecture,
                                     **{**DIMENSIONS, **FAMILIES[architecture], **WIDE})


def state_records(state: bytes) -> list[tuple[int, int, int, bytes]]:
    """(format id, out, in, blocks) of each weight of a packed state (nn/packed_state.hpp)."""
    assert state[:8] == b"RTNF4ST1"
    (count,) = struct.unpack_from("<Q", state, 8)
    offset, records = 16, []
    for _ in range(count):
        out, inner, block, double, format_id, scale_block = struct.unpack_from(
            "<QQQIIQ", state, offset)
        offset += 40
        assert format_id != 0, "only block formats here"
        assert (block, double, scale_block) == (256 if 5 <= format_id <= 7 else 32, 0, 0)
        (size,) = struct.unpack_from("<Q", state, offset)
        offset += 8
        records.append((format_id, out, inner, state[offset:offset + size]))
        offset += size
    assert offset == len(state)
    return records


PROJECTIONS = ("attention.query.weight", "attention.key.weight", "attention.value.weight",
               "attention.output.weight", "feed_forward.gate.weight", "feed_forward.up.weight",
               "feed_forward.down.weight", "language_model_head.weight")


def projection_weights(model) -> list[array]:
    """The dense projection weights in the model's projection order (the packed state's)."""
    with model.parameters() as parameters:
        flat, offset, weights = parameters.flat_values(), 0, []
        for name, shape in zip(parameters.names, parameters.shapes, strict=True):
            size = math.prod(shape)
            if name.endswith(PROJECTIONS):
                weights.append(flat[offset:offset + size])
            offset += size
    return weights


def relative_rms(first, second) -> float:
    flat_first = [v for row in first for v in row] if isinstance(first[0], list) else first
    flat_second = [v for row in second for v in row] if isinstance(second[0], list) else second
    while flat_first and isinstance(flat_first[0], list):
        flat_first = [v for row in flat_first for v in row]
        flat_second = [v for row in flat_second for v in row]
    error = math.sqrt(sum((a - b) ** 2 for a, b in zip(flat_first, flat_second, strict=True)))
    return error / math.sqrt(sum(a * a for a in flat_first))


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantize_blocks_writes_the_blocks_ggmls_reference_quantizer_writes(dtype):
    """Every projection of a model filled with edge-case blocks (ties, zeros, one huge value,
    tiny scales) against the package's exporter, byte for byte."""
    edge = [value for block in edge_case_blocks() for value in block]
    with LlamaMistralTransformer(wide_preset("llama")) as model:
        with model.parameters() as parameters:
            total = parameters.total_numel
            parameters.load_flat_values([edge[i % len(edge)] for i in range(total)])
        dense = projection_weights(model)
        model.quantize_blocks(dtype)
        assert model.linear_weight_format == dtype
        records = state_records(model.packed_quantized_state())
    assert len(records) == len(dense) == 7 * 2 + 1
    for index, (values, (format_id, out, inner, blocks)) in enumerate(
            zip(dense, records, strict=True)):
        assert format_id == FORMAT_IDS[dtype]
        assert out * inner == len(values)
        expected = gguf_export._quantize(array("f", values), TYPE_CODE[dtype], f"weight {index}")
        assert blocks == expected, f"projection {index}"


@pytest.mark.parametrize(("dtype", "architecture"), [("q4_1", "qwen2"), ("q5_0", "llama")])
def test_q4_1_and_q5_0_blocks_equal_the_gguf_packages_quantizer(tmp_path, dtype, architecture):
    python = oracle_python("gguf")
    with LlamaMistralTransformer(wide_preset(architecture)) as model:
        dense = projection_weights(model)
        model.quantize_blocks(dtype)
        assert model.linear_weight_format == dtype
        records = state_records(model.packed_quantized_state())
    values = array("f", [value for weight in dense for value in weight])
    (tmp_path / "values.f32").write_bytes(values.tobytes())
    script = textwrap.dedent("""
        import sys, numpy, gguf
        values = numpy.fromfile(sys.argv[1], dtype=numpy.float32).reshape(-1, 32)
        kind = getattr(gguf.GGMLQuantizationType, sys.argv[2])
        sys.stdout.buffer.write(gguf.quants.quantize(values, kind).tobytes())
    """)
    theirs = subprocess.run([python, "-c", script, str(tmp_path / "values.f32"), dtype.upper()],
                            check=True, capture_output=True, timeout=300).stdout
    assert b"".join(record[3] for record in records) == theirs


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_a_gguf_files_blocks_load_as_they_are_with_the_float32_logits(tmp_path, architecture,
                                                                      dtype):
    config = wide_preset(architecture)
    bundle = capture(config)
    path = export_gguf(bundle, tmp_path / f"{architecture}.gguf", dtype=dtype)
    # The exporter writes the embedding table in the block format too: it is kept packed,
    # and a tied head multiplies by it.
    assert gguf_tensor_types(bundle, dtype)["token_embd.weight"] == dtype.upper()
    with load_pretrained(path, maximum_context=0) as dense:
        expected = forward_values(dense.model, TOKENS)
        assert dense.model.linear_weight_format is None
    with load_pretrained(path, maximum_context=0, weights="file") as packed:
        model = packed.model
        assert model.linear_weight_format == dtype
        memory = model.quantized_memory
        projections = 7 * config.block_count + (0 if config.tie_embeddings else 1)
        assert memory.weight_count == projections + 1  # and the embedding table
        with model.parameters() as parameters:
            assert "token_embedding.weight" not in parameters.names
        # The packed state holds the table last, and loads into a twin.
        state = model.packed_quantized_state()
        assert len(state_records(state)) == projections + 1
        with load_pretrained(path, maximum_context=0, weights="file") as twin:
            twin.model.load_packed_quantized_state(state)
            assert forward_values(twin.model, TOKENS) == forward_values(model, TOKENS)
        # Nothing but the blocks is resident, and they are the file's size.
        assert memory.resident_payload_bytes == memory.logical_payload_bytes
        assert memory.logical_payload_bytes * 32 == memory.fp32_equivalent_bytes // 4 * \
            BLOCK_BYTES[dtype]
        ours = forward_values(model, TOKENS)
    # The same decoded values, multiplied in another order: float rounding only.
    assert relative_rms(expected, ours) <= 1e-5


def test_the_packed_state_round_trips_the_blocks_and_refuses_another_format():
    with LlamaMistralTransformer(wide_preset("llama")) as source, \
            LlamaMistralTransformer(replace(wide_preset("llama"), random_seed=9)) as target, \
            LlamaMistralTransformer(wide_preset("llama")) as other:
        source.quantize_blocks("q4_1")
        target.quantize_blocks("q4_1")
        other.quantize_blocks("q8_0")
        state = source.packed_quantized_state()
        before = forward_values(other, TOKENS)
        with pytest.raises(RiftcoTransformerError, match="format q4_1 differs from the model's "
                                                         "q8_0"):
            other.load_packed_quantized_state(state)
        assert forward_values(other, TOKENS) == before
        target.load_packed_quantized_state(state)
        assert target.packed_quantized_state() == state
        # With the dense rest (embedding, norms) copied too, target is source.
        with source.parameters() as parameters:
            rest = parameters.flat_values()
        with target.parameters() as parameters:
            parameters.load_flat_values(rest)
        assert forward_values(target, TOKENS) == forward_values(source, TOKENS)


def test_refusals_name_the_argument_and_change_nothing(tmp_path):
    with LlamaMistralTransformer(preset("llama")) as narrow:  # width 16
        before = forward_values(narrow, TOKENS)
        with pytest.raises(RiftcoTransformerError,
                           match=r"quantize_blocks: blocks\.0\.attention\.query: .*in_features 16 "
                                 r"of a q8_0 weight is not a multiple of its 32-element block"):
            narrow.quantize_blocks("q8_0")
        assert narrow.linear_weight_format is None
        assert forward_values(narrow, TOKENS) == before
        for bad in ("nf4", "Q8_0", "q5_k"):
            with pytest.raises(ValueError,
                               match="format must be one of 'q8_0', 'q4_0', 'q4_1', 'q5_0'"):
                narrow.quantize_blocks(bad)
        with pytest.raises(TypeError):
            narrow.quantize_blocks(8)
    with LlamaMistralTransformer(wide_preset("llama")) as model:
        model.quantize_blocks("q4_0")
        with pytest.raises(RiftcoTransformerError, match="already packed"):
            model.quantize_blocks("q8_0")
        with pytest.raises(RiftcoTransformerError, match="already packed"):
            model.quantize_nf4()
        assert model.linear_weight_format == "q4_0"
    # weights="file" needs a GGUF file whose projections are in a block format.
    f32 = export_gguf(capture(wide_preset("mistral")), tmp_path / "f32.gguf")
    with pytest.raises(RiftcoTransformerError,
                       match=r"needs every projection in a block format \(q8_0, q4_0, q4_1, "
                             r"q5_0, q4_k, q5_k, q6_k, f16 or bf16\), but tensor "
                             r"'blk\.0\.attn_q\.weight' \(blocks\.0\.attention\.query\.weight\) "
                             r"is F32"):
        load_pretrained(f32, weights="file")
    bundle = tmp_path / "model.rift"
    capture(wide_preset("mistral")).save(bundle)
    with pytest.raises(ValueError, match="weights='file' keeps a GGUF file's block formats"):
        load_pretrained(bundle, weights="file")
    with pytest.raises(ValueError, match="weights must be one of 'f32', 'file', 'q8_0'"):
        load_pretrained(f32, weights="q4_k")  # a K format: from files only
    # An explicit conversion at load time.
    with load_pretrained(f32, weights="q8_0") as converted:
        assert converted.model.linear_weight_format == "q8_0"


def test_smollm2_keeps_its_q4_1_blocks_with_the_float32_logits():
    path = smollm2_path()
    tokenizer = PretrainedTokenizer.from_gguf(path)
    tokens = tokenizer.encode("The capital of France is")
    with load_pretrained(path, maximum_context=64) as dense:
        expected = forward_values(dense.model, tokens)
    with load_pretrained(path, maximum_context=64, weights="file") as packed:
        assert packed.model.linear_weight_format == "mixed"  # Q4_1 projections, Q8_0 table
        memory = packed.model.quantized_memory
        assert memory.weight_count == 7 * 30 + 1  # the projections (Q4_1), the table (Q8_0)
        # 66.4 MB of Q4_1 blocks and 30.1 MB of Q8_0 table: the file's 98 MB, less its norms.
        assert memory.resident_payload_bytes == memory.logical_payload_bytes < 97_000_000
        ours = forward_values(packed.model, tokens)
        answer = packed.generate("The capital of France is", max_new_tokens=4)
    assert relative_rms(expected, ours) <= 1e-4
    assert "Paris" in answer.generated_text
    tokenizer.close()


def test_a_packed_embedding_refuses_what_would_silently_drop_it(tmp_path):
    path = export_gguf(capture(wide_preset("qwen3")), tmp_path / "tied.gguf", dtype="q8_0")
    with load_pretrained(path, maximum_context=0, weights="file") as loaded:
        model = loaded.model
        before = forward_values(model, TOKENS)
        with pytest.raises(RiftcoTransformerError, match="untie"):
            model.untie_embeddings()
        model.attach_lora(LoraConfig(rank=2, alpha=4.0))
        with pytest.raises(RiftcoTransformerError,
                           match="merge_lora: the token embedding table is packed"):
            model.merge_lora()
        assert model.lora_config is not None
        # A state without the table (one weight short) is refused, naming the counts.
        state = model.packed_quantized_state()
        records = state_records(state)
        short = struct.pack("<Q", len(records) - 1)
        truncated = state[:8] + short + state[16:state.rindex(records[-1][3]) - 48]
        with pytest.raises(RiftcoTransformerError,
                           match=f"{len(records) - 1} packed weights given for "
                                 f"{len(records) - 1} projections and the packed token "
                                 "embedding"):
            model.load_packed_quantized_state(truncated)
        assert forward_values(model, TOKENS) == before  # the adapters start at B = 0


def test_the_cli_loads_a_files_blocks_and_refuses_them_for_other_files(tmp_path):
    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype="q4_0")
    arguments = ("generate", "--model", path, "--prompt", "abc", "--max-new-tokens", "4")
    packed = run_cli(*arguments, "--weights", "file")
    dense = run_cli(*arguments)
    assert packed.returncode == 0 and dense.returncode == 0, packed.stderr + dense.stderr
    assert packed.stdout == dense.stdout  # greedy: the same decoded values give the same text
    bundle = tmp_path / "model.rift"
    capture(wide_preset("llama")).save(bundle)
    refused = run_cli("generate", "--model", bundle, "--prompt", "abc", "--weights", "file")
    assert refused.returncode == 2
    assert "--weights file keeps a GGUF file's blocks" in refused.stderr
    converted = run_cli("generate", "--model", bundle, "--prompt", "abc", "--max-new-tokens", "2",
                        "--weights", "q8_0")
    assert converted.returncode == 0, converted.stderr


def test_a_bundle_of_a_block_packed_model_is_refused_naming_the_format(tmp_path):
    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype="q8_0")
    with load_pretrained(path, maximum_context=0, weights="file") as loaded:
        with pytest.raises(ValueError, match="model has packed q8_0 weights .* which bundles do "
                                             "not hold yet"):
            loaded.save(tmp_path / "model.rift")
    assert not (tmp_path / "model.rift").exists()


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_lora_trains_over_a_files_blocks_as_over_their_float32_values(tmp_path, dtype):
    """QLoRA over a GGUF file's own blocks: the same losses as LoRA over the float32 load of
    the same file (the same decoded values), and the blocks never move."""
    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype=dtype)
    targets = TOKENS[1:] + TOKENS[:1]
    losses = {}
    for weights in ("f32", "file"):
        with load_pretrained(path, maximum_context=0, weights=weights) as loaded:
            model = loaded.model
            before = model.packed_quantized_state() if weights == "file" else None
            model.attach_lora(LoraConfig(rank=4, alpha=8.0, random_seed=3))
            run = losses[weights] = []
            with model.adapter_parameters() as adapters, \
                    Adam(adapters, learning_rate=1e-2) as adam:
                for _ in range(8):
                    with model([TOKENS]) as logits, \
                            cross_entropy(logits, [targets]) as loss:
                        run.append(loss.item())
                        loss.backward()
                    adam.step()
            if before is not None:
                assert model.packed_quantized_state() == before
    assert losses["file"][-1] < losses["file"][0]
    assert losses["file"] == pytest.approx(losses["f32"], rel=1e-4)


def test_the_c_abi_refuses_a_format_that_is_not_a_block_format():
    """rt_model_quantize_linear_weights takes RT_WEIGHT_FORMAT_Q8_0/_Q4_0/_Q4_1/_Q5_0/_F16/
    _BF16 only: NF4 (its own functions take its block sizes) and unknown values are invalid_argument naming
    the value, the K formats (5, 6, 7) invalid_argument naming where they come from, and the
    model stays dense."""
    from riftco_transformer.native._errors import check_status
    from riftco_transformer.native._loader import library

    with LlamaMistralTransformer(k_preset()) as model:
        for value in (0, 10, -1, 1 << 20):
            with model._native() as pointer, \
                    pytest.raises(RiftcoTransformerError,
                                  match=f"format {value} is not a block format"):
                check_status(library().rt_model_quantize_linear_weights(pointer, value))
        for value, name in ((5, "q4_k"), (6, "q5_k"), (7, "q6_k")):
            with model._native() as pointer, \
                    pytest.raises(RiftcoTransformerError,
                                  match=f"format {name} cannot be produced here: K-format "
                                        "weights come from GGUF files"):
                check_status(library().rt_model_quantize_linear_weights(pointer, value))
        assert model.linear_weight_format is None


# ---- Q5_0 and the K formats (Q4_K, Q5_K, Q6_K): 256-element blocks -------------------------

GGUF_TYPES = {"q5_0": 6, "q4_k": 12, "q5_k": 13, "q6_k": 14, "bf16": 30}
TYPE_BLOCK = {"q5_0": (32, 22), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
# Which tensor of a block gets which format (every format twice, and a packed table).
K_PLAN = {"attn_q": "q5_0", "attn_k": "q4_k", "attn_v": "q5_k", "attn_output": "q6_k",
          "ffn_gate": "q4_k", "ffn_up": "q6_k", "ffn_down": "q5_k", "token_embd": "q6_k",
          "output": "q6_k"}


def random_blocks(kind: str, count: int, seed: int) -> bytes:
    """``count`` values' worth of valid random blocks: random codes, and binary16 scales that
    keep every weight within about ±1 (as in a real model)."""
    import random

    elements, size = TYPE_BLOCK[kind]
    generator = random.Random(seed)
    scale = {"q5_0": 2.0**-5, "q4_k": 2.0**-11, "q5_k": 2.0**-12, "q6_k": 2.0**-13}[kind]
    halves = {"q5_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}[kind]
    out = bytearray()
    for _ in range(count // elements):
        block = bytearray(generator.randbytes(size))
        for offset in halves:
            value = scale * (1.0 + generator.random())
            sign = -1.0 if kind in ("q5_0", "q6_k") and generator.random() < 0.5 else 1.0
            struct.pack_into("<e", block, offset, sign * value)
        out += block
    return bytes(out)


def read_string(data: bytes, offset: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    return data[offset + 8:offset + 8 + length], offset + 8 + length


def skip_value(data: bytes, offset: int, kind: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if kind == 8:
        return read_string(data, offset)[1]
    if kind == 9:
        element, count = struct.unpack_from("<IQ", data, offset)
        offset += 12
        for _ in range(count):
            offset = skip_value(data, offset, element)
        return offset
    return offset + sizes[kind]


def with_block_types(source: Path, target: Path, plan: dict[str, str]) -> dict[str, tuple]:
    """Rewrites the float32 GGUF ``source`` with the matrices ``plan`` names (by their name's
    second-to-last part) as random valid blocks of that format; returns
    ``{tensor: (format, dims, blocks)}`` of the rewritten ones."""
    data = source.read_bytes()
    _, _, tensor_count, kv_count = struct.unpack_from("<IIQQ", data, 0)
    offset = 24
    for _ in range(kv_count):
        _, offset = read_string(data, offset)
        (kind,) = struct.unpack_from("<I", data, offset)
        offset = skip_value(data, offset + 4, kind)
    head = data[:offset]
    infos = []
    for _ in range(tensor_count):
        name, offset = read_string(data, offset)
        (rank,) = struct.unpack_from("<I", data, offset)
        dims = struct.unpack_from(f"<{rank}Q", data, offset + 4)
        kind, position = struct.unpack_from("<IQ", data, offset + 4 + 8 * rank)
        offset += 4 + 8 * rank + 12
        infos.append((name.decode(), dims, kind, position))
    data_start = (offset + 31) // 32 * 32
    rewritten, tensors, blobs = {}, [], []
    for index, (name, dims, kind, position) in enumerate(infos):
        count = math.prod(dims)
        blob = data[data_start + position:data_start + position + 4 * count]
        chosen = plan.get(name.split(".")[-2]) if len(dims) == 2 else None
        if chosen == "bf16":  # the float32 values' top 16 bits
            assert kind == 0, name
            blob = b"".join(blob[i + 2:i + 4] for i in range(0, len(blob), 4))
            kind = GGUF_TYPES[chosen]
            rewritten[name] = (chosen, dims, blob)
        elif chosen is not None:
            assert kind == 0 and dims[0] % TYPE_BLOCK[chosen][0] == 0, name
            blob = random_blocks(chosen, count, seed=index)
            kind = GGUF_TYPES[chosen]
            rewritten[name] = (chosen, dims, blob)
        tensors.append((name, dims, kind))
        blobs.append(blob)
    out, position = bytearray(head), 0
    out[8:16] = struct.pack("<Q", len(tensors))
    for (name, dims, kind), blob in zip(tensors, blobs, strict=True):
        encoded = name.encode()
        out += struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", len(dims))
        out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, position)
        position = (position + len(blob) + 31) // 32 * 32
    out += b"\0" * ((len(out) + 31) // 32 * 32 - len(out))
    for blob in blobs:
        out += blob + b"\0" * ((len(blob) + 31) // 32 * 32 - len(blob))
    target.write_bytes(bytes(out))
    return rewritten


def k_preset(architecture: str = "llama"):
    """Every projection's input width a multiple of 256 (and the table's rows)."""
    return LlamaMistralConfig.preset(architecture, **{
        **DIMENSIONS, **FAMILIES[architecture], "model_width": 256, "feed_forward_width": 512,
        "head_width": 64, "block_count": 1})


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_k_format_and_q5_0_blocks_load_as_they_are_with_the_float32_logits(tmp_path,
                                                                         architecture):
    config = k_preset(architecture)
    source = export_gguf(capture(config), tmp_path / "f32.gguf")
    path = tmp_path / "k.gguf"
    rewritten = with_block_types(Path(source), path, K_PLAN)
    assert {kind for kind, _, _ in rewritten.values()} == set(GGUF_TYPES) - {"bf16"}
    with load_pretrained(path, maximum_context=0) as dense:
        expected = forward_values(dense.model, TOKENS)
    with load_pretrained(path, maximum_context=0, weights="file") as packed:
        model = packed.model
        assert model.linear_weight_format == "mixed"
        memory = model.quantized_memory
        assert memory.resident_payload_bytes == memory.logical_payload_bytes == sum(
            len(blob) for _, _, blob in rewritten.values())
        ours = forward_values(model, TOKENS)
        # The packed state keeps each format's blocks exactly, and loads into a twin.
        state = model.packed_quantized_state()
        with load_pretrained(path, maximum_context=0, weights="file") as twin:
            twin.model.load_packed_quantized_state(state)
            assert forward_values(twin.model, TOKENS) == ours
    assert relative_rms(expected, ours) <= 1e-5


def test_our_decoding_of_q5_0_and_the_k_formats_equals_the_gguf_packages(tmp_path):
    """The float32 load dequantizes every format as ``gguf.quants.dequantize`` does, bit for
    bit (the unpermuted matrices: value, output and the feed-forward ones)."""
    python = oracle_python("gguf")
    source = export_gguf(capture(k_preset()), tmp_path / "f32.gguf")
    path = tmp_path / "k.gguf"
    plan = {**K_PLAN, "attn_v": "q5_0"}
    rewritten = with_block_types(Path(source), path, plan)
    names = {"blk.0.attn_v.weight": "attention.value.weight",
             "blk.0.attn_output.weight": "attention.output.weight",
             "blk.0.ffn_gate.weight": "feed_forward.gate.weight",
             "blk.0.ffn_up.weight": "feed_forward.up.weight",
             "blk.0.ffn_down.weight": "feed_forward.down.weight"}
    script = textwrap.dedent("""
        import sys, numpy, gguf
        kind = getattr(gguf.GGMLQuantizationType, sys.argv[2])
        rows = numpy.fromfile(sys.argv[1], dtype=numpy.uint8)
        size = gguf.GGML_QUANT_SIZES[kind][1]
        values = gguf.quants.dequantize(rows.reshape(-1, size), kind)
        sys.stdout.buffer.write(values.astype(numpy.float32).tobytes())
    """)
    with load_pretrained(path, maximum_context=0) as dense:
        with dense.model.parameters() as parameters:
            flat, offset, ours = parameters.flat_values(), 0, {}
            for name, shape in zip(parameters.names, parameters.shapes, strict=True):
                ours[name] = flat[offset:offset + math.prod(shape)]
                offset += math.prod(shape)
    for tensor, parameter in names.items():
        kind, _, blob = rewritten[tensor]
        (tmp_path / "blocks").write_bytes(blob)
        theirs = subprocess.run([python, "-c", script, str(tmp_path / "blocks"), kind.upper()],
                                check=True, capture_output=True, timeout=300).stdout
        assert ours[f"blocks.0.{parameter}"].tobytes() == theirs, tensor


def test_the_k_formats_are_refused_as_a_conversion_naming_where_they_come_from():
    with LlamaMistralTransformer(k_preset()) as model:
        before = forward_values(model, TOKENS)
        with pytest.raises(ValueError, match="format must be one of 'q8_0', 'q4_0', 'q4_1', "
                                             "'q5_0'"):
            model.quantize_blocks("q4_k")
        assert model.linear_weight_format is None
        assert forward_values(model, TOKENS) == before


# ---- QLoRA over a file's blocks: fine_tune_pretrained and riftco post-train --weights file ----

def instruction_examples():
    from test_decoder_families import INSTRUCTIONS

    from riftco_transformer.instructions import read_instructions_jsonl

    return read_instructions_jsonl(INSTRUCTIONS)[:12]


def test_fine_tuning_over_a_files_blocks_trains_adapters_and_never_moves_the_blocks(tmp_path):
    from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained

    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype="q4_0")
    config = PostTrainingConfig(steps=6, batch_size=2, backend="cpu", fine_tuning_method="qlora",
                                learning_rate=1e-2, response_only_loss=False)
    with load_pretrained(path, maximum_context=0, weights="file") as loaded:
        model = loaded.model
        blocks = model.packed_quantized_state()
        before = forward_values(model, TOKENS)
        result = fine_tune_pretrained(loaded, instruction_examples(), config)
        # The adapters trained over the blocks and stay attached; the blocks are the file's.
        assert model.lora_attached
        assert model.linear_weight_format == "q4_0"
        assert model.packed_quantized_state() == blocks
        losses = [metric.loss for metric in result.metrics if metric.phase == "train"]
        assert losses[-1] < losses[0]
        assert forward_values(model, TOKENS) != before
        assert result.adapter is not None and result.fine_tuning_method == "qlora"
        # The adapter alone, saved and applied to a fresh load of the same file: the same model.
        tuned = forward_values(model, TOKENS)
        adapter = result.adapter.save(tmp_path / "adapter")
    with load_pretrained(path, maximum_context=0, weights="file", adapter=adapter) as again:
        assert relative_rms(tuned, forward_values(again.model, TOKENS)) <= 1e-6


def test_fine_tuning_over_a_files_blocks_refuses_what_it_cannot_do_and_changes_nothing(
        tmp_path):
    from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained

    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype="q8_0")
    with load_pretrained(path, maximum_context=0, weights="file") as loaded:
        model = loaded.model
        blocks = model.packed_quantized_state()
        for method in ("full", "lora"):
            config = PostTrainingConfig(steps=2, batch_size=2, fine_tuning_method=method)
            with pytest.raises(ValueError, match=f"packed \\(q8_0: a GGUF file's blocks or a "
                                                 f"conversion\\), which only fine_tuning_method "
                                                 f"'qlora' trains over; load the model with "
                                                 f"weights='f32' for '{method}'"):
                fine_tune_pretrained(loaded, instruction_examples(), config)
        config = PostTrainingConfig(steps=2, batch_size=2, fine_tuning_method="qlora")
        with pytest.raises(ValueError, match="checkpoints do not hold a model packed in q8_0 "
                                             "blocks yet"):
            fine_tune_pretrained(loaded, instruction_examples(), config,
                                 checkpoint_path=tmp_path / "run.riftckpt")
        assert not (tmp_path / "run.riftckpt").exists()
        assert not model.lora_attached
        assert model.packed_quantized_state() == blocks


def test_riftco_post_train_weights_file_writes_the_adapter_and_refuses_a_bundle(tmp_path):
    from test_decoder_families import INSTRUCTIONS

    path = export_gguf(capture(wide_preset("llama")), tmp_path / "model.gguf", dtype="q4_0")
    common = ("post-train", "--model", path, "--instructions", INSTRUCTIONS, "--steps", "2",
              "--batch-size", "2", "--weights", "file")
    refused = {
        ("--method", "lora", "--adapter-output", tmp_path / "a"): "needs --method qlora",
        ("--method", "qlora", "--output", tmp_path / "out.rift"): "write --adapter-output",
        ("--method", "qlora", "--adapter-output", tmp_path / "b", "--checkpoint",
         tmp_path / "c.riftckpt"): "checkpoints cannot hold packed blocks yet",
    }
    for extra, message in refused.items():
        run = run_cli(*common, *extra)
        assert run.returncode == 2, run.stderr
        assert message in run.stderr
    assert not any((tmp_path / name).exists() for name in ("a", "out.rift", "b", "c.riftckpt"))
    run = run_cli(*common, "--method", "qlora", "--adapter-output", tmp_path / "adapter")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    base = run_cli("post-train", "--base", tmp_path / "x.rift", "--instructions", INSTRUCTIONS,
                   "--weights", "file", "--method", "qlora", "--adapter-output", tmp_path / "d")
    assert base.returncode == 2 and "--weights file applies to --model" in base.stderr


def test_the_synthetic_gguf_tool_writes_a_file_that_loads_at_its_precision(tmp_path):
    """tools/make_synthetic_llama_gguf.py (its tiny shape): a Q4_0 file in the real layout that
    loads with weights="file" and decodes; it refuses to write inside the repository."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "make_synthetic_llama_gguf.py"
    output = tmp_path / "tiny.gguf"
    run = subprocess.run([sys.executable, str(tool), "--shape", "tiny", "--output", str(output)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    with load_pretrained(output, maximum_context=32, weights="file") as loaded:
        assert loaded.model.linear_weight_format == "q4_0"
        memory = loaded.model.quantized_memory
        assert memory.weight_count == 7 * 2 + 2  # the projections, the head and the table
        assert memory.resident_payload_bytes == (256 * 256 * 2 + 256 * 128 * 2 + 256 * 512 * 3) \
            * 2 // 32 * 18 + 2 * 512 * 256 // 32 * 18
        assert len(loaded.generate("t1 t2", max_new_tokens=3).generated_text) > 0
    inside = Path(__file__).resolve().parents[2] / "build" / "tiny.gguf"
    run = subprocess.run([sys.executable, str(tool), "--shape", "tiny", "--output", str(inside)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "is inside the repository" in run.stderr
    assert not inside.exists()


# ---- dense half precision: F16 and BF16 matrices kept as they are -----------------------------

@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_f16_and_bf16_matrices_load_as_they_are_with_the_float32_logits(tmp_path, kind):
    config = wide_preset("qwen3")  # a tied table: kept in half precision and multiplied by
    if kind == "f16":
        path = export_gguf(capture(config), tmp_path / "f16.gguf", dtype="f16")
    else:
        source = export_gguf(capture(config), tmp_path / "f32.gguf")
        path = tmp_path / "bf16.gguf"
        plan = {name: "bf16" for name in ("attn_q", "attn_k", "attn_v", "attn_output",
                                          "ffn_gate", "ffn_up", "ffn_down", "token_embd")}
        assert len(with_block_types(Path(source), path, plan)) == 7 * config.block_count + 1
    with load_pretrained(path, maximum_context=0) as dense:
        expected = forward_values(dense.model, TOKENS)
    with load_pretrained(path, maximum_context=0, weights="file") as packed:
        model = packed.model
        assert model.linear_weight_format == kind
        memory = model.quantized_memory
        assert memory.resident_payload_bytes * 2 == memory.fp32_equivalent_bytes
        with model.parameters() as parameters:
            assert "token_embedding.weight" not in parameters.names
        ours = forward_values(model, TOKENS)
    assert relative_rms(expected, ours) <= 1e-5


def test_quantize_blocks_rounds_to_bf16_and_f16_and_refuses_what_overflows():
    with LlamaMistralTransformer(wide_preset("llama")) as model:
        dense = projection_weights(model)
        expected = forward_values(model, TOKENS)
        model.quantize_blocks("bf16")
        assert model.linear_weight_format == "bf16"
        records = state_records(model.packed_quantized_state())
        # Round to nearest, ties to even, of every value's float32 bits.
        for values, (format_id, _, _, blocks) in zip(dense, records, strict=True):
            assert format_id == 9
            words = struct.unpack(f"<{len(values)}I", array("f", values).tobytes())
            rounded = [((w + 0x7FFF + ((w >> 16) & 1)) >> 16) for w in words]
            assert blocks == struct.pack(f"<{len(rounded)}H", *rounded)
        assert relative_rms(expected, forward_values(model, TOKENS)) <= 1e-2
    with LlamaMistralTransformer(wide_preset("llama")) as model:
        with model.parameters() as parameters:
            offset = 0
            for name, shape in zip(parameters.names, parameters.shapes, strict=True):
                if name == "blocks.0.attention.query.weight":
                    break
                offset += math.prod(shape)
            values = parameters.flat_values()
            values[offset + 5] = 1e6  # beyond binary16's 65504
            parameters.load_flat_values(values)
        before = forward_values(model, TOKENS)
        with pytest.raises(RiftcoTransformerError, match="weight value at flat index 5 "
                                                         r"\(1000000\) is beyond f16's range"):
            model.quantize_blocks("f16")
        assert model.linear_weight_format is None
        assert forward_values(model, TOKENS) == before


def test_the_cli_offers_exactly_load_pretraineds_weight_choices():
    from riftco_transformer import cli, pretrained

    assert cli._WEIGHT_CHOICES == pretrained.WEIGHT_CHOICES
