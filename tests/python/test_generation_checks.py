"""Generation checks on held-out prompts during post-training (issue 31): the JSONL reader and
its errors, greedy answers in the chat template scored by exact text or regular expression,
the rounds before, during and after training (results, metadata, metric records), and
``riftco post-train --generation-checks``."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPOSITORY
from riftco_transformer.generation_checks import (
    GenerationCheck,
    parse_generation_checks_jsonl,
    read_generation_checks_jsonl,
    run_generation_checks,
)
from riftco_transformer.instructions import InstructionExample

GOOD = '{"prompt": "What is 2 + 3?", "expect": "5"}'

# ---- the reader ---------------------------------------------------------------------------


@pytest.mark.parametrize("line, message", [
    ('{"expect": "5"}', "missing key 'prompt'"),
    ('{"prompt": "hi", "expect": "a", "match": "a"}', "has both 'expect' and 'match'"),
    ('{"prompt": "hi"}', "needs 'expect' (the exact response) or 'match'"),
    ('{"prompt": 3, "expect": "a"}', "'prompt' must be a string, got a number"),
    ('{"prompt": "hi", "expect": null}', "'expect' must be a string, got null"),
    ('{"prompt": "hi", "match": ["a"]}', "'match' must be a string, got an array"),
    ('{"prompt": "hi", "match": "(unclosed"}',
     "'match' '(unclosed' is not a valid regular expression"),
    ('{"prompt": "hi", "expect": "a", "max_new_tokens": 0}', "'max_new_tokens' must be an integer"),
    ('{"prompt": "hi", "expect": "a", "max_new_tokens": "8"}', "got '8'"),
    ('{"prompt": "hi", "expect": "a", "max_new_tokens": true}', "got True"),
    ('{"prompt": "hi", "expect": "a", "max_new_tokens": 2.5}', "got 2.5"),
    ('{"prompt": "   ", "expect": "a"}', "prompt is blank"),
    ('{"prompt": "hi", "expected": "a"}', "unknown key 'expected'"),
    ('{"prompt": "hi", "expect": "a"', "invalid JSON"),
    ('{"prompt": "hi", "prompt": "x", "expect": "a"}', "duplicate key 'prompt'"),
    ('["hi"]', "expected a JSON object"),
])
def test_the_reader_names_the_line_and_what_is_wrong(tmp_path, line, message):
    path = tmp_path / "checks.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the bad line is line 3 (blanks count)
    with pytest.raises(ValueError) as error:
        read_generation_checks_jsonl(path)
    assert str(error.value).startswith(f"{path}:3: ")
    assert message in str(error.value)


def test_the_reader_reads_defaults_and_overrides(tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_text('\ufeff{"prompt": "a", "expect": "x"}\n'
                    '{"prompt": "b", "match": "^y+$", "max_new_tokens": 3}\n\n')
    checks = read_generation_checks_jsonl(path)
    assert checks == (GenerationCheck("a", expect="x", max_new_tokens=64),
                      GenerationCheck("b", match="^y+$", max_new_tokens=3))
    assert read_generation_checks_jsonl(path, max_new_tokens=9)[0].max_new_tokens == 9
    assert checks[1].to_record() == {"prompt": "b", "match": "^y+$", "max_new_tokens": 3}
    with pytest.raises(ValueError, match="no generation checks"):
        parse_generation_checks_jsonl("\n  \n", "empty.jsonl")
    with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
        read_generation_checks_jsonl(path, max_new_tokens=0)
    with pytest.raises(FileNotFoundError):
        read_generation_checks_jsonl(tmp_path / "missing.jsonl")


def test_a_check_passes_on_the_exact_text_or_a_regex_search():
    exact = GenerationCheck("p", expect="  2 + 3 is 5. ")
    assert exact.passes("2 + 3 is 5.\n") and not exact.passes("2 + 3 is 5")
    pattern = GenerationCheck("p", match=r"\b5\b")
    assert pattern.passes("it is 5.") and not pattern.passes("it is 15")
    for keywords, error in (({"expect": "a", "match": "a"}, ValueError), ({}, ValueError),
                            ({"expect": 5}, TypeError), ({"match": "["}, ValueError),
                            ({"expect": "a", "max_new_tokens": 0}, ValueError)):
        with pytest.raises(error):
            GenerationCheck("p", **keywords)


# ---- answering the checks -----------------------------------------------------------------


@pytest.fixture(scope="module")
def base_bundle():
    from riftco_transformer.pretraining import PretrainingConfig, pretrain_text

    corpus = (REPOSITORY / "data" / "corpus" / "alice_in_wonderland.txt").read_text()[:12000]
    return pretrain_text(corpus, PretrainingConfig(steps=3, context_size=64, model_width=32,
                                                   feed_forward_width=64, backend="cpu")).bundle


EXAMPLES = (InstructionExample("Say hi.", "hi"), InstructionExample("Say yes.", "yes"))
CONFIG = {"steps": 2, "batch_size": 2, "backend": "cpu", "evaluation_interval": 1,
          "learning_rate": 1e-2}


def _answers(bundle, prompts, max_new_tokens=8):
    """The greedy answers of ``bundle`` to ``prompts`` (in the plain chat template)."""
    from riftco_transformer.serving.chat import PlainChatTemplate

    runtime = bundle.instantiate("cpu")
    try:
        checks = [GenerationCheck(prompt, match="", max_new_tokens=max_new_tokens)
                  for prompt in prompts]
        return run_generation_checks(runtime.model, runtime.tokenizer, PlainChatTemplate(),
                                     checks)
    finally:
        runtime.close()


def _checks_from_the_base(bundle):
    """Checks built from the base's own greedy answers: pass, fail, regex pass, regex fail,
    and a short one."""
    answer = _answers(bundle, ["Say hi."]).checks[0].generated
    assert answer.strip(), "the base answers nothing: the checks would prove little"
    return (GenerationCheck("Say hi.", expect=answer, max_new_tokens=8),
            GenerationCheck("Say hi.", expect=answer + " and something it never says",
                            max_new_tokens=8),
            GenerationCheck("Say hi.", match="^" + re.escape(answer[:3]), max_new_tokens=8),
            GenerationCheck("Say hi.", match=r"^\d{40}$", max_new_tokens=8),
            GenerationCheck("Say yes.", match="", max_new_tokens=2))


def test_greedy_answers_are_deterministic_and_respect_max_new_tokens(base_bundle):
    first = _answers(base_bundle, ["Say hi.", "Say yes."], max_new_tokens=5)
    assert first.checks == _answers(base_bundle, ["Say hi.", "Say yes."], 5).checks
    for outcome in first.checks:
        assert outcome.generated_token_count <= 5
        if outcome.finish_reason == "length":
            assert outcome.generated_token_count == 5
    assert (first.phase, first.passed, first.total) == ("generation", 2, 2)


def test_post_training_runs_the_checks_before_during_and_after(base_bundle):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    checks = _checks_from_the_base(base_bundle)
    records = []
    result = post_train(base_bundle, EXAMPLES, PostTrainingConfig(**CONFIG),
                        metric_sink=records.append, validation_examples=EXAMPLES[:1],
                        generation_checks=checks)
    # The base answers as it did alone: the checks built from its answer pass, the others fail.
    before = result.base_generation
    assert [outcome.passed for outcome in before.checks] == [True, False, True, False, True]
    assert (before.step, before.passed, before.total) == (0, 3, 5)
    assert before.checks[4].generated_token_count <= 2
    # One round after each validation: before training and at every evaluation.
    phases = [(record.phase, record.step) for record in records if record.phase != "train"]
    assert phases == [("validation", 0), ("generation", 0), ("validation", 1),
                      ("generation", 1), ("validation", 2), ("generation", 2)]
    rounds = [record for record in records if record.phase == "generation"]
    assert rounds[0] == before and result.generation_metrics == tuple(rounds)
    assert all(record not in result.metrics for record in rounds)  # losses only there
    # After: the tuned model's round (its last one, full training), also in the metadata.
    after = result.tuned_generation
    assert after == rounds[-1] and after.step == 2
    assert result.bundle.metadata["generation_checks"] == {
        "total": 5, "base_passed": 3, "tuned_passed": after.passed}
    # The saved child answers exactly that.
    assert _answers(result.bundle, ["Say hi."]).checks[0].generated == after.checks[0].generated
    # Nothing in training depends on the checks.
    plain = post_train(base_bundle, EXAMPLES, PostTrainingConfig(**CONFIG),
                       validation_examples=EXAMPLES[:1])
    assert plain.bundle.weights == result.bundle.weights
    assert plain.base_generation is None and plain.tuned_generation is None
    assert "generation_checks" not in plain.bundle.metadata


def test_lora_rounds_run_with_the_adapters_and_after_the_merge(base_bundle):
    from riftco_transformer.post_training import PostTrainingConfig, post_train

    checks = _checks_from_the_base(base_bundle)[:2]
    records = []
    result = post_train(base_bundle, EXAMPLES, PostTrainingConfig(
        **{**CONFIG, "evaluation_interval": 2}, fine_tuning_method="lora"),
        metric_sink=records.append, generation_checks=checks)
    # Without validation examples the rounds still run: before, then every evaluation step.
    assert [(r.phase, r.step) for r in records if r.phase == "generation"] == [
        ("generation", 0), ("generation", 2)]
    assert result.base_generation.passed == 1
    assert result.tuned_generation.step == 2  # after the merge, a round of its own
    assert result.bundle.metadata["generation_checks"]["base_passed"] == 1


def test_bad_generation_checks_are_refused_before_anything_trains(base_bundle):
    from riftco_transformer.post_training import post_train

    for checks, message in ((["not a check"], "generation_checks\\[0\\]"),
                            ("text", "sequence of GenerationCheck")):
        with pytest.raises(TypeError, match=message):
            post_train(base_bundle, EXAMPLES, generation_checks=checks)

    class Formatter:  # no chat template to prompt the model with
        def format(self, example):
            return example.prompt + example.response

    with pytest.raises(TypeError, match="need the formatter's chat template"):
        post_train(base_bundle, EXAMPLES, formatter=Formatter(),
                   generation_checks=[GenerationCheck("hi", expect="x")])


def test_a_pretrained_model_is_checked_as_riftco_chat_answers_it(tmp_path):
    from riftco_transformer import load_pretrained
    from riftco_transformer.post_training import PostTrainingConfig, fine_tune_pretrained
    from test_decoder_families import family_bundle

    path = family_bundle("qwen3", maximum_context=64).save(tmp_path / "qwen3.rift")
    with load_pretrained(path) as loaded:
        said = loaded.chat([{"role": "user", "content": "Say hi."}], max_new_tokens=4)
        checks = [GenerationCheck("Say hi.", expect=said, max_new_tokens=4),
                  GenerationCheck("Say hi.", match="^never$", max_new_tokens=4)]
        records = []
        result = fine_tune_pretrained(loaded, EXAMPLES, PostTrainingConfig(
            **CONFIG, fine_tuning_method="lora"), metric_sink=records.append,
            generation_checks=checks)
        assert [outcome.passed for outcome in result.base_generation.checks] == [True, False]
        assert [r.step for r in records if r.phase == "generation"] == [0, 1, 2]
        tuned = loaded.chat([{"role": "user", "content": "Say hi."}], max_new_tokens=4)
        assert result.tuned_generation.checks[0].generated == tuned
        assert result.tuned_generation.checks[0].passed == (tuned == said)


# ---- the command line ---------------------------------------------------------------------


def test_post_train_cli_prints_and_records_each_round(base_bundle, tmp_path, capsys):
    from riftco_transformer.cli import main

    base = tmp_path / "base.rift"
    base_bundle.save(base)
    instructions = tmp_path / "train.jsonl"
    instructions.write_text("".join(json.dumps(e.to_record()) + "\n" for e in EXAMPLES))
    answer = _answers(base_bundle, ["Say hi."]).checks[0].generated
    checks = tmp_path / "checks.jsonl"
    checks.write_text(json.dumps({"prompt": "Say hi.", "expect": answer}) + "\n" +
                      json.dumps({"prompt": "Say hi.", "match": r"^\d{40}$",
                                  "max_new_tokens": 3}) + "\n")
    output = tmp_path / "tuned.rift"
    status = main(["post-train", "--base", str(base), "--instructions", str(instructions),
                   "--output", str(output), "--steps", "2", "--batch-size", "2",
                   "--eval-every", "1", "--backend", "cpu", "--no-progress",
                   "--generation-checks", str(checks), "--generation-max-new-tokens", "8"])
    printed = capsys.readouterr().out
    assert status == 0
    lines = re.findall(r"generation checks at step (\d+): (\d+)/2 passed", printed)
    assert [step for step, _ in lines] == ["0", "1", "2"] and lines[0][1] == "1"
    records = [json.loads(line) for line in
               (tmp_path / "tuned.rift.metrics.jsonl").read_text().splitlines()]
    rounds = [record for record in records if record["phase"] == "generation"]
    assert [record["step"] for record in rounds] == [0, 1, 2]
    assert rounds[0]["passed"] == 1 and rounds[0]["total"] == 2
    first = rounds[0]["checks"]
    assert [check["index"] for check in first] == [0, 1]
    assert [check["passed"] for check in first] == [True, False]
    assert first[0]["generated"] == answer and first[1]["generated_token_count"] <= 3
    from riftco_transformer.artifacts import ModelBundle

    tuned_passed = ModelBundle.load(output).metadata["generation_checks"]["tuned_passed"]
    assert f"generation checks 1/2 (base) -> {tuned_passed}/2 passed (tuned)" in printed
    assert (tmp_path / "tuned.rift.loss.svg").read_text().startswith(("<svg", "<?xml"))
    # A bad regular expression stops the command before anything trains.
    checks.write_text(GOOD + '\n{"prompt": "x", "match": "a("}\n')
    refused = tmp_path / "refused.rift"
    status = main(["post-train", "--base", str(base), "--instructions", str(instructions),
                   "--output", str(refused), "--generation-checks", str(checks)])
    error = capsys.readouterr().err
    assert status == 2 and f"{checks}:2:" in error and "'a('" in error
    assert not refused.exists() and not (tmp_path / "refused.rift.metrics.jsonl").exists()
