"""Post-training defaults scaled to the method and the data (issue 31, item 3): the rule
(``post_training.scaled_defaults``), explicit flags winning, ``--steps`` with ``--epochs``
refused, the printed line, and the demo's held-out response loss going down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import PYTHON_SOURCE, REPOSITORY
from riftco_transformer.post_training import (
    DEFAULT_EPOCHS,
    DEFAULT_LEARNING_RATES,
    DEFAULT_MAXIMUM_STEPS,
    DEFAULT_MINIMUM_STEPS,
    scaled_defaults,
)

CORPUS = REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt"
INSTRUCTIONS = REPOSITORY / "data" / "instructions" / "tiny_instructions.jsonl"


def riftco(*arguments, check=True, timeout=600):
    environment = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    completed = subprocess.run(
        [sys.executable, "-m", "riftco_transformer", *map(str, arguments)],
        env=environment, capture_output=True, text=True, timeout=timeout,
    )
    if check and completed.returncode != 0:
        raise AssertionError(f"riftco {arguments} failed ({completed.returncode}):\n"
                             f"{completed.stdout}\n{completed.stderr}")
    return completed


def test_the_documented_values():
    assert DEFAULT_EPOCHS == 3
    assert (DEFAULT_MINIMUM_STEPS, DEFAULT_MAXIMUM_STEPS) == (10, 1000)
    assert DEFAULT_LEARNING_RATES == {"full": 2e-5, "lora": 1e-4, "qlora": 1e-4}


@pytest.mark.parametrize("examples, batch, accumulation, steps", [
    (50, 2, 1, 75),     # 150 / 2
    (45, 2, 1, 68),     # 135 / 2 = 67.5, rounded up
    (36, 4, 1, 27),
    (50, 2, 4, 19),     # 150 / 8 = 18.75
    (64, 8, 2, 12),     # exactly 12
    (3, 2, 1, 10),      # 5, raised to the floor
    (0, 2, 1, 10),      # no examples: the floor (the trainer then says what is wrong)
    (100000, 2, 1, 1000),  # 150000, held to the cap
])
def test_steps_are_epochs_over_the_examples_within_the_floor_and_cap(examples, batch,
                                                                      accumulation, steps):
    chosen = scaled_defaults("lora", examples, batch, accumulation)
    assert chosen.steps == steps and chosen.epochs == DEFAULT_EPOCHS
    assert chosen.reasons[0].startswith(f"3 epochs of {examples} examples at {batch} rows x "
                                        f"{accumulation} accumulation per step")
    if steps == 10 and examples < 4:
        assert "raised to the floor 10" in chosen.reasons[0]
    if steps == 1000:
        assert "= 150000, held to the cap 1000" in chosen.reasons[0]


@pytest.mark.parametrize("method, rate", [("full", 2e-5), ("lora", 1e-4), ("qlora", 1e-4)])
def test_the_learning_rate_follows_the_method(method, rate):
    chosen = scaled_defaults(method, 50, 2)
    assert chosen.learning_rate == rate and chosen.reasons[1] == f"the {method} default"


def test_warmup_is_five_percent_of_the_steps_with_a_decay_and_none_when_constant():
    assert scaled_defaults("lora", 50, 2).warmup_steps == 0
    assert scaled_defaults("lora", 50, 2, lr_schedule="cosine").warmup_steps == 4  # 5% of 75
    assert scaled_defaults("lora", 50, 2, lr_schedule="linear", steps=200).warmup_steps == 10
    # Always below the steps (the config's rule), even for a single step.
    assert scaled_defaults("lora", 1, 2, lr_schedule="cosine", steps=1).warmup_steps == 0
    assert scaled_defaults("lora", 1, 2, lr_schedule="cosine", steps=2).warmup_steps == 1
    assert "5% of the steps, then cosine decay" in scaled_defaults(
        "lora", 50, 2, lr_schedule="cosine").reasons[2]


def test_given_values_always_win():
    chosen = scaled_defaults("qlora", 50, 2, steps=7, learning_rate=3e-3, lr_schedule="cosine",
                             warmup_steps=2)
    assert (chosen.steps, chosen.learning_rate, chosen.warmup_steps) == (7, 3e-3, 2)
    assert chosen.reasons == ("given", "given", "given") and chosen.epochs is None
    # Given epochs are honoured exactly: no floor, no cap.
    assert scaled_defaults("full", 3, 2, epochs=1).steps == 2
    assert scaled_defaults("full", 100000, 2, epochs=1).steps == 50000
    assert scaled_defaults("full", 50, 2, epochs=0.5).steps == 13


def test_steps_with_epochs_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="steps or epochs, not both"):
        scaled_defaults("lora", 50, 2, steps=10, epochs=2)
    with pytest.raises(ValueError, match="epochs"):
        scaled_defaults("lora", 50, 2, epochs=0)
    with pytest.raises(ValueError, match="method"):
        scaled_defaults("prefix", 50, 2)


def test_the_line_says_each_value_and_why():
    line = scaled_defaults("qlora", 36, 2, lr_schedule="cosine").describe()
    assert line == ("54 steps (3 epochs of 36 examples at 2 rows x 1 accumulation per step), "
                    "learning rate 0.0001 (the qlora default), warmup 3 steps (5% of the steps, "
                    "then cosine decay)")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("defaults")
    corpus = directory / "corpus.txt"
    corpus.write_text(CORPUS.read_text()[:20000])
    path = directory / "base.rift"
    riftco("pretrain", "--file", corpus, "--output", path, "--steps", 5, "--context", 128,
           "--model-width", 32, "--feed-forward-width", 64, "--eval-every", 5, "--backend", "cpu")
    return path


def _train_records(path):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["phase"] == "train"]


def test_post_train_prints_and_uses_the_scaled_defaults(base, tmp_path):
    output = tmp_path / "t.rift"
    completed = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                       output, "--method", "lora", "--batch-size", 8, "--lr-schedule", "cosine",
                       "--backend", "cpu")
    # 45 examples, 3 epochs at 8 rows: ceil(135 / 8) = 17 steps; warmup ceil(0.85) = 1.
    line = ("post-train: 17 steps (3 epochs of 45 examples at 8 rows x 1 accumulation per step), "
            "learning rate 0.0001 (the lora default), warmup 1 steps (5% of the steps, then "
            "cosine decay)")
    assert line in completed.stdout.splitlines()
    assert completed.stdout.index(line) < completed.stdout.index("post-train: lora")
    train = _train_records(tmp_path / "t.rift.metrics.jsonl")
    assert [r["step"] for r in train] == list(range(1, 18))
    assert max(r["learning_rate"] for r in train) == pytest.approx(1e-4, rel=1e-6)


def test_post_train_counts_the_training_split_and_explicit_flags_win(base, tmp_path):
    output = tmp_path / "t.rift"
    completed = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                       output, "--validation-fraction", 0.2, "--epochs", 1, "--batch-size", 4,
                       "--gradient-accumulation", 2, "--learning-rate", 3e-4, "--backend", "cpu")
    held_out = re.search(r"post-train: (\d+) training and", completed.stdout)
    examples = int(held_out.group(1))
    steps = -(-examples // 8)
    assert (f"post-train: {steps} steps (1 epochs of {examples} examples at 4 rows x 2 "
            "accumulation per step), learning rate 0.0003 (given), warmup 0 steps (a constant "
            "rate has none)") in completed.stdout
    train = _train_records(tmp_path / "t.rift.metrics.jsonl")
    assert len(train) == steps
    assert [r["learning_rate"] for r in train] == pytest.approx([3e-4] * steps, rel=1e-6)
    completed = riftco("post-train", "--base", base, "--instructions", INSTRUCTIONS, "--output",
                       output, "--steps", 3, "--lr-schedule", "linear", "--warmup-steps", 2,
                       "--backend", "cpu")
    assert ("post-train: 3 steps (given), learning rate 2e-05 (the full default), warmup 2 "
            "steps (given)") in completed.stdout
    assert len(_train_records(tmp_path / "t.rift.metrics.jsonl")) == 3


def test_steps_and_epochs_together_are_a_usage_error(tmp_path):
    completed = riftco("post-train", "--base", tmp_path / "missing.rift", "--instructions",
                       INSTRUCTIONS, "--output", tmp_path / "t.rift", "--steps", 5, "--epochs", 2,
                       check=False)
    assert completed.returncode == 2
    assert "give --steps or --epochs, not both" in completed.stderr
    assert completed.stderr.count("\n") == 1 and not (tmp_path / "t.rift").exists()


def test_help_shows_every_default_rule():
    text = " ".join(riftco("post-train", "--help").stdout.split())
    for phrase in ("ceil(epochs x examples / (batch size x accumulation)), at least 10 and at "
                   "most 1000", "(default: 3, when --steps is not given",
                   "(default: by method, 2e-5 full, 1e-4 lora and qlora)",
                   "(default: 5% of the steps, rounded up, with those schedules; 0 with "
                   "constant)"):
        assert phrase in text
    assert "(default: None)" not in text


@pytest.mark.skipif(not os.environ.get("RIFTCO_TRANSFORMER_SLOW_TESTS"),
                    reason="the whole demo (300 pretraining steps, 2.5 CPU-minutes); set "
                    "RIFTCO_TRANSFORMER_SLOW_TESTS=1 to run it")
def test_the_demo_lowers_the_held_out_response_loss(tmp_path):
    output = riftco("demo", "--output-dir", tmp_path, "--backend", "cpu", timeout=1200).stdout
    assert ("39 steps (8 epochs of 39 examples at 8 rows x 1 accumulation per step), learning "
            "rate 0.001 (given), warmup 2 steps (5% of the steps, then cosine decay)") in output
    found = re.search(r"response loss (\d+\.\d+) \(pretrained\) -> (\d+\.\d+) \(post-trained\)",
                      output)
    before, after = float(found.group(1)), float(found.group(2))
    # Measured 4.894 -> 3.905 (the issue saw 4.89 -> 5.88 with 200 steps at a constant 1e-3).
    assert after < before - 0.5, output
