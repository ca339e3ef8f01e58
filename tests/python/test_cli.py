"""The ``riftco`` command line end to end, as a user runs it: pretrain, post-train, evaluate,
generate, inspect, convert, resume, --help, and bad input (one line, exit status 2)."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest
from support import build_facts

from conftest import PYTHON_SOURCE, REPOSITORY
from riftco_transformer import backend_available

CORPUS = REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt"
INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"
SUBCOMMANDS = ("pretrain", "post-train", "evaluate", "generate", "serve", "inspect", "convert",
               "demo")


def riftco(*arguments, check=True, timeout=300, cwd=None):
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    completed = subprocess.run(
        [sys.executable, "-m", "riftco_transformer", *map(str, arguments)],
        env=environment, capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )
    if check and completed.returncode != 0:
        raise AssertionError(f"riftco {arguments} failed ({completed.returncode}):\n"
                             f"{completed.stdout}\n{completed.stderr}")
    return completed


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli")
    corpus = directory / "corpus.txt"
    corpus.write_text(CORPUS.read_text()[:40000])
    base = directory / "base.rift"
    # A context that holds every tiny instruction example whole, for post-train.
    pretrained = riftco("pretrain", "--file", corpus, "--output", base, "--steps", 30,
                        "--context", 128, "--model-width", 32, "--feed-forward-width", 64,
                        "--eval-every", 10, "--backend", "cpu", "--checkpoint",
                        directory / "run.riftckpt", "--checkpoint-every", 10)
    tuned = directory / "tuned.rift"
    post = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output", tuned,
                  "--steps", 20, "--method", "lora", "--learning-rate", "0.02",
                  "--validation-instructions", INSTRUCTIONS, "--backend", "cpu")
    return directory, corpus, base, tuned, pretrained, post


def test_pretrain_writes_the_bundle_metrics_curve_and_checkpoint(journey):
    directory, _, base, _, pretrained, _ = journey
    assert "pretrain: 30 steps" in pretrained.stdout and "tokens/s" in pretrained.stdout
    assert base.is_file() and (directory / "run.riftckpt").is_file()
    lines = (directory / "base.rift.metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records if r["phase"] == "train"] == list(range(1, 31))
    svg = (directory / "base.rift.loss.svg").read_text()
    assert svg.startswith("<svg") or svg.startswith("<?xml")
    # Not a terminal: plain progress lines, no carriage returns.
    assert "\r" not in pretrained.stderr and "30/30" in pretrained.stderr


def test_post_train_evaluate_and_generate(journey):
    directory, corpus, base, tuned, _, post = journey
    assert "post-train: lora" in post.stdout and "held-out loss" in post.stdout
    inspected = riftco("inspect", tuned).stdout
    assert "stage        post_training" in inspected
    parent = json.loads(riftco("inspect", base, "--json").stdout)["artifact_id"]
    assert f"parent       {parent}" in inspected
    scored = json.loads(riftco("evaluate", "--bundle", base, "--file", corpus, "--json").stdout)
    assert scored["target_token_count"] > 1000 and scored["loss"] > 0
    instructions = riftco("evaluate", "--bundle", tuned, "--instructions", INSTRUCTIONS,
                          "--response-only").stdout
    assert "evaluate: loss" in instructions
    generated = riftco("generate", "--bundle", tuned, "--prompt", "What is 2 + 3?", "--chat",
                       "--max-new-tokens", 12)
    assert "finish reason" in generated.stderr and "prompt " in generated.stderr
    plain = riftco("generate", "--bundle", base, "--prompt", "Alice", "--max-new-tokens", 5)
    assert plain.stdout.startswith("Alice")
    # llama.cpp-style timings: the prompt's tokens and the decode rate after the first token.
    assert re.search(r"prompt \d+ tokens in [\d.]+ ms \([\d.]+ tokens/s\); 5 tokens "
                     r"generated, 4 after the first in [\d.]+ ms \([\d.]+ tokens/s\)",
                     plain.stderr), plain.stderr
    sampled = riftco("generate", "--bundle", base, "--prompt", "Alice", "--max-new-tokens", 5,
                     "--temperature", 0.8, "--top-p", 0.9, "--min-p", 0.05, "--top-k", 40,
                     "--repetition-penalty", 1.1, "--seed", 3)
    again = riftco("generate", "--bundle", base, "--prompt", "Alice", "--max-new-tokens", 5,
                   "--temperature", 0.8, "--top-p", 0.9, "--min-p", 0.05, "--top-k", 40,
                   "--repetition-penalty", 1.1, "--seed", 3)
    assert sampled.stdout == again.stdout and sampled.stdout.startswith("Alice")
    refused = riftco("generate", "--bundle", base, "--prompt", "Alice", "--top-p", 1.5,
                     check=False)
    assert refused.returncode == 2 and "--top-p" in refused.stderr


def test_inspect_a_checkpoint_and_resume_it(journey):
    directory, corpus, base, _, _, _ = journey
    assert "global_step   30" in riftco("inspect", directory / "run.riftckpt").stdout
    # Resuming the finished run at the same step count reproduces the same bundle.
    again = directory / "again.rift"
    riftco("pretrain", "--file", corpus, "--output", again, "--steps", 30, "--context", 128,
           "--model-width", 32, "--feed-forward-width", 64, "--eval-every", 10, "--backend",
           "cpu", "--resume", directory / "run.riftckpt")
    from riftco_transformer.artifacts import ModelBundle

    assert ModelBundle.load(again).weights == ModelBundle.load(base).weights


def test_convert_round_trip_keeps_the_artifact(journey):
    directory, _, base, _, _, _ = journey
    riftco("convert", base, directory / "base.safetensors")
    riftco("convert", directory / "base.safetensors", directory / "back.rift")
    assert (directory / "back.rift").read_bytes() == base.read_bytes()
    assert "F32 tensors" in riftco("inspect", directory / "base.safetensors").stdout


def test_every_subcommand_has_help_with_defaults():
    for command in SUBCOMMANDS:
        text = riftco(command, "--help").stdout
        assert text.startswith(f"usage: riftco {command}")
        assert "(default:" in text or command in ("inspect", "convert")
    assert "(default: 100)" in riftco("pretrain", "--help").stdout


@pytest.mark.parametrize(
    "arguments, message",
    [
        (("pretrain", "--output", "x.rift"), "required: --file"),
        (("pretrain", "--file", "missing.txt", "--output", "x.rift"), "missing.txt"),
        (("pretrain", "--file", CORPUS, "--output", "x.rift", "--steps", "0"), "positive integer"),
        (("post-train", "--base", CORPUS, "--instructions", INSTRUCTIONS, "--output", "y.rift"),
         "error"),
        (("inspect", CORPUS), "error"),
        (("generate", "--bundle", "nothing.rift", "--prompt", "x"), "nothing.rift"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, arguments, message):
    completed = riftco(*arguments, check=False, cwd=tmp_path)
    assert completed.returncode == 2, completed.stderr
    assert list(tmp_path.iterdir()) == [], "a failed command left files behind"
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert message in lines[0] and lines[0].startswith("riftco")


@pytest.mark.skipif(backend_available("pjrt"), reason="pjrt is available here")
def test_backend_pjrt_is_a_choice_that_an_unavailable_build_refuses_by_name(tmp_path):
    reason = ("RIFTCO_TRANSFORMER_PJRT_PLUGIN" if build_facts()["tpu"]
              else "RIFTCO_TRANSFORMER_ENABLE_TPU")
    completed = riftco("pretrain", "--file", CORPUS, "--output", "x.rift", "--steps", 1,
                       "--backend", "pjrt", check=False, cwd=tmp_path)
    assert completed.returncode == 2, completed.stderr
    assert "invalid choice" not in completed.stderr
    assert "'pjrt' is unavailable" in completed.stderr
    assert reason in completed.stderr
    assert list(tmp_path.iterdir()) == [], "a failed command left files behind"


def test_bad_jsonl_names_the_line(journey, tmp_path):
    _, _, base, _, _, _ = journey
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "response": "there"}\n{"prompt": "x"}\n')
    completed = riftco("post-train", "--base", base, "--instructions", bad, "--output",
                       tmp_path / "z.rift", check=False)
    assert completed.returncode == 2 and "bad.jsonl:2" in completed.stderr
    assert not (tmp_path / "z.rift").exists()


def test_demo_runs_the_whole_journey(tmp_path):
    output = riftco("demo", "--steps", 10, "--post-train-steps", 5, "--output-dir", tmp_path,
                    "--backend", "cpu").stdout
    for step in ("1/4 pretraining", "2/4 post-training", "3/4 evaluating", "4/4 generating",
                 "demo: done"):
        assert step in output
    assert (tmp_path / "pretrained.rift").is_file() and (tmp_path / "post_trained.rift").is_file()


def test_serve_answers_a_request_then_stops(journey):
    import re
    import urllib.request

    _, _, _, tuned, _, _ = journey
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    process = subprocess.Popen(
        [sys.executable, "-m", "riftco_transformer", "serve", "--bundle", str(tuned), "--port",
         "0", "--max-requests", "1", "--backend", "cpu"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        url = re.search(r"at (http://\S+?)/ ", line).group(1)
        request = urllib.request.Request(
            f"{url}/v1/generate", data=json.dumps({"prompt": "Alice", "max_new_tokens": 4}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        assert len(body["generated_token_ids"]) == 4 and body["prompt"] == "Alice"
        assert process.wait(timeout=60) == 0
        assert "serve: stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()



def test_post_train_can_hold_out_a_fraction_of_its_instructions(journey, tmp_path):
    _, _, base, _, _, _ = journey
    completed = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                       tmp_path / "t.rift", "--steps", 3, "--validation-fraction", 0.2,
                       "--backend", "cpu")
    assert "held-out examples (validation fraction 0.2)" in completed.stdout
    assert "held-out loss" in completed.stdout


def test_post_train_schedules_accumulates_reports_its_data_and_stops_early(journey, tmp_path):
    _, _, base, _, _, _ = journey
    output = tmp_path / "t.rift"
    completed = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                       output, "--steps", 6, "--validation-fraction", 0.2, "--method", "lora",
                       "--learning-rate", 5.0, "--lr-schedule", "cosine", "--warmup-steps", 2,
                       "--gradient-accumulation", 2, "--eval-every", 1,
                       "--early-stopping-patience", 2, "--lora-targets", "all-linear",
                       "--backend", "cpu")
    # Data: whole examples (the one longer than the context truncated, and counted).
    assert "38 of 38 examples trained whole" in completed.stdout
    assert "1 truncated to the context" in completed.stdout
    records = [json.loads(line) for line in
               (tmp_path / "t.rift.metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    # base 5, W = 2: the warmup's rates, read back from the library.
    assert [r["learning_rate"] for r in train[:2]] == pytest.approx([2.5, 5.0], rel=1e-6)
    # A rate of 5 wrecks the adapters: validation never beats step 0, so two validations
    # without a new best stop the run, and the bundle keeps the best (the base) model.
    assert len(train) == 2 and "stopped early" in completed.stdout
    from riftco_transformer.artifacts import ModelBundle

    assert ModelBundle.load(output).weights == ModelBundle.load(base).weights
    assert ModelBundle.load(output).metadata["config"]["lora"]["targets"] == [
        "attention.query", "attention.key", "attention.value", "attention.output",
        "feed_forward.expand", "feed_forward.project"]
    refused = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                     output, "--lora-targets", "attention.q", check=False)
    assert refused.returncode == 2 and "unknown projection 'attention.q'" in refused.stderr
    refused = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                     output, "--early-stopping-patience", 2, check=False)
    assert refused.returncode == 2 and "needs held-out examples" in refused.stderr
    refused = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                     output, "--warmup-steps", 2, check=False)
    assert refused.returncode == 2 and "needs lr_schedule" in refused.stderr


def test_version_and_every_default_in_help():
    assert riftco("--version").stdout.startswith("riftco-transformer ")
    help_text = riftco("post-train", "--help").stdout
    text = help_text[help_text.index("options:"):]
    # --steps, --learning-rate and --warmup-steps are scaled to the data and the method: their
    # help states the rule (test_post_training_defaults.py).
    section = text[text.index("--steps "):]
    assert "(default: enough for --epochs" in " ".join(section.split()[:30])
    for flag, default in (("--batch-size", "2"), ("--lr-schedule", "constant"),
                          ("--lora-rank", "4"), ("--eval-every", "10"), ("--overlong", "truncate")):
        section = text[text.index(flag + " "):]
        assert f"(default: {default})" in " ".join(section.split()[:30]), flag


def test_a_resumed_run_continues_the_metrics_file_exactly(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS.read_text()[:20000])
    common = ("--file", corpus, "--context", 16, "--eval-every", 5, "--backend", "cpu",
              "--checkpoint-every", 5)
    riftco("pretrain", *common, "--output", tmp_path / "a.rift", "--steps", 12,
           "--checkpoint", tmp_path / "a.riftckpt")
    riftco("pretrain", *common, "--output", tmp_path / "b.rift", "--steps", 5,
           "--checkpoint", tmp_path / "b.riftckpt")
    riftco("pretrain", *common, "--output", tmp_path / "b.rift", "--steps", 12,
           "--resume", tmp_path / "b.riftckpt")

    def losses(name):
        records = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        return [(r["phase"], r["step"], r["loss"]) for r in records]

    assert losses("b.rift.metrics.jsonl") == losses("a.rift.metrics.jsonl")
    assert (tmp_path / "b.rift").read_bytes() != b""
    from riftco_transformer.artifacts import ModelBundle

    assert ModelBundle.load(tmp_path / "b.rift").weights == ModelBundle.load(tmp_path / "a.rift").weights
