"""NF4 codes and block scales against bitsandbytes' own NF4 quantizer (an independent oracle).

Skips unless ``bitsandbytes`` (and the torch it needs) can be imported and quantize on this
machine's CPU. Our payload comes from the model's canonical packed state (nn/packed_state.hpp:
"RTNF4ST1", then per weight its metadata, codes and scales); bitsandbytes' comes from
``bitsandbytes.functional.quantize_4bit(W, blocksize=64, quant_type="nf4")``, which packs the
first element of each pair in the HIGH nibble (ours: the LOW nibble).
"""

from __future__ import annotations

import struct

import pytest

from riftco_transformer import DecoderOnlyTransformer, TransformerConfig

CONFIG = TransformerConfig(
    vocabulary_size=64,
    maximum_context=8,
    model_width=128,
    head_count=4,
    block_count=1,
    feed_forward_width=256,
    random_seed=11,
)


def _first_weight_of_state(state: bytes):
    assert state[:8] == b"RTNF4ST1"
    offset = 16
    out, inn, block = struct.unpack_from("<QQQ", state, offset)
    offset += 24
    double_quantized, reserved, scale_block = struct.unpack_from("<IIQ", state, offset)
    offset += 16
    assert (double_quantized, reserved, scale_block) == (0, 0, 0)
    (code_bytes,) = struct.unpack_from("<Q", state, offset)
    offset += 8
    packed = state[offset : offset + code_bytes]
    offset += code_bytes
    (scale_count,) = struct.unpack_from("<Q", state, offset)
    offset += 8
    scales = struct.unpack_from(f"<{scale_count}f", state, offset)
    codes = []
    for byte in packed:
        codes += [byte & 0x0F, byte >> 4]
    return (out, inn, block), codes[: out * inn], scales


def test_codes_and_scales_match_bitsandbytes_nf4():
    torch = pytest.importorskip("torch")
    try:
        import bitsandbytes.functional as bnb_functional
    except Exception as error:  # noqa: BLE001 - any import failure means "no oracle here"
        pytest.skip(f"bitsandbytes is not importable: {error}")
    with DecoderOnlyTransformer(CONFIG) as model:
        with model.parameters() as parameters:
            index = parameters.names.index("blocks.0.attention.query.weight")
            offset = sum(
                shape[0] * (shape[1] if len(shape) > 1 else 1)
                for shape in parameters.shapes[:index]
            )
            values = parameters.flat_values()[offset : offset + 128 * 128]
        model.quantize_nf4(block_size=64, double_quantization=False)
        (out, inn, block), codes, scales = _first_weight_of_state(model.packed_quantized_state())
    assert (out, inn, block) == (128, 128, 64)
    weight = torch.tensor(list(values), dtype=torch.float32).reshape(128, 128)
    try:
        packed, quant_state = bnb_functional.quantize_4bit(weight, blocksize=64, quant_type="nf4")
    except Exception as error:  # noqa: BLE001 - e.g. a build without a CPU backend
        pytest.skip(f"bitsandbytes cannot quantize on this CPU: {error}")
    theirs = []
    for byte in packed.flatten().tolist():
        theirs += [byte >> 4, byte & 0x0F]
    absmax = quant_state.absmax.float().flatten().tolist()
    assert len(absmax) == len(scales)
    assert absmax == pytest.approx(list(scales), rel=0, abs=0)
    # Codes: identical except where a value sits within float rounding of a midpoint between
    # two codebook entries (a tie the two implementations may break differently).
    codebook = [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ]
    midpoints = [(a + b) / 2 for a, b in zip(codebook, codebook[1:])]
    mismatches = 0
    for position, (ours, other) in enumerate(zip(codes, theirs[: len(codes)])):
        if ours == other:
            continue
        scale = scales[position // 64]
        normalized = values[position] / scale if scale else 0.0
        assert min(abs(normalized - m) for m in midpoints) < 1e-6, (position, ours, other)
        mismatches += 1
    assert mismatches <= len(codes) // 10000
