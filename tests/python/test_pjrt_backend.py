"""backend="pjrt" from Python: pretraining, serving and the low-level API on the PJRT adapter.

They run where the library was built with RIFTCO_TRANSFORMER_ENABLE_TPU=ON and
RIFTCO_TRANSFORMER_PJRT_PLUGIN names a PJRT plugin (ctest's python.pjrt in the tpu-release
workflow: XLA's CPU plugin from PyPI); elsewhere they report themselves skipped. Each compares
with the same work on the CPU backend (float32 on both sides; 2e-4 relative tolerance on losses
after several optimizer steps, since XLA's reduction order differs from ours).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from riftco_transformer import DecoderOnlyTransformer, Tokenizer, backend_available
from riftco_transformer.pretraining import PretrainingConfig, pretrain_text
from riftco_transformer.serving import FullForwardEngine, TextGenerator

pytestmark = pytest.mark.skipif(
    not backend_available("pjrt"), reason="the pjrt backend is unavailable in this build/env"
)

TEXT = ("the quick brown fox jumps over the lazy dog. " * 40
        + "pack my box with five dozen liquor jugs. " * 40)


def _losses(backend: str) -> list[float]:
    config = PretrainingConfig(steps=12, context_size=16, batch_size=4, tokenizer_method="byte",
                               vocabulary_size=256, model_width=16, head_count=4, block_count=1,
                               feed_forward_width=32, evaluation_interval=6, backend=backend)
    result = pretrain_text(TEXT, config)
    assert result.bundle is not None
    return [m.loss for m in result.metrics if m.phase == "train"]


def test_pretraining_on_pjrt_follows_the_cpu_loss_curve():
    cpu = _losses("cpu")
    device = _losses("pjrt")
    assert len(cpu) == len(device) == 12
    for step, (a, b) in enumerate(zip(device, cpu)):
        assert math.isclose(a, b, rel_tol=2e-4, abs_tol=2e-4), (step, a, b)
    assert device[-1] < device[0]


def test_a_model_moved_to_pjrt_generates_what_it_generates_on_the_cpu(tiny_config):
    tokenizer = Tokenizer("abcdefghijklmnopqrstuvwxyz .,!?\n")
    config = dataclasses.replace(tiny_config, vocabulary_size=tokenizer.vocab_size)
    with DecoderOnlyTransformer(config) as model:
        expected = TextGenerator(FullForwardEngine(model), tokenizer).generate(
            "hello", max_new_tokens=8)
        model.to("pjrt")
        assert model.backend == "pjrt"
        with TextGenerator(model, tokenizer, kv_cache="paged", kv_cache_block_size=4) as g:
            assert g.generate("hello", max_new_tokens=8) == expected
    tokenizer.close()
