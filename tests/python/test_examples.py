"""The examples under examples/python, run as a user runs them (fresh interpreters)."""

from __future__ import annotations

import json
import math
import re
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import python_environment

from riftco_transformer import backend_available

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def test_the_tensor_snippet_prints_the_product_shape_and_values(run_python):
    result = run_python(script=EXAMPLES / "tensor_snippet.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["(2, 2)", "[58.0, 64.0, 139.0, 154.0]"]


@pytest.mark.skipif(backend_available("cuda"), reason="CUDA is available here")
def test_the_training_snippet_refuses_to_replace_the_missing_cuda_backend(run_python):
    result = run_python(script=EXAMPLES / "training_snippet.py")
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "RiftcoTransformerError: backend_unavailable" in last_line
    assert "cuda" in last_line


def test_the_training_snippet_on_cpu_prints_a_finite_loss_and_a_positive_gradient_norm(
    run_python,
):
    source = (EXAMPLES / "training_snippet.py").read_text()
    assert source.count('.to("cuda")') == 1
    result = run_python(source.replace('.to("cuda")', '.to("cpu")'))
    assert result.returncode == 0, result.stderr
    loss, gradient_norm = map(float, result.stdout.split())
    assert math.isfinite(loss) and loss > 0
    assert gradient_norm > 0


def test_train_tiny_reports_validation_and_every_training_step(run_python):
    result = run_python(
        script=EXAMPLES / "train_tiny.py", arguments=("--steps", "12", "--backend", "cpu")
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("train_tiny: backend=cpu attention=materialized")
    assert re.fullmatch(r"step 0 validation loss [\d.]+ perplexity [\d.]+", lines[1])
    training = [line for line in lines if " train loss " in line]
    assert len(training) == 12
    pattern = (
        r"step (\d+) train loss ([\d.]+) average ([\d.]+) "
        r"gradient_norm ([\d.]+) clip_scale ([\d.]+)"
    )
    for step, line in enumerate(training, start=1):
        match = re.fullmatch(pattern, line)
        assert match and int(match[1]) == step
        assert 0 < float(match[5]) <= 1
    validation_steps = [line.split()[1] for line in lines if " validation loss " in line]
    assert validation_steps == ["0", "10", "12"]  # before, every 10 steps, and at the end
    first, last = (float(line.split()[4]) for line in (lines[1], lines[-1]))
    assert last < first


def test_train_tiny_runs_the_byte_tokenizer_flash_attention_and_checkpointing(run_python):
    result = run_python(
        script=EXAMPLES / "train_tiny.py",
        arguments=(
            "--steps",
            "2",
            "--backend",
            "auto",
            "--tokenizer",
            "byte",
            "--attention",
            "flash",
            "--activation-checkpointing",
            "block",
            "--text",
            "abcdefgh" * 20,
            "--context",
            "8",
        ),
    )
    assert result.returncode == 0, result.stderr
    assert "attention=flash activation_checkpointing=block tokenizer=byte vocab=8" in result.stdout


def test_train_tiny_reads_a_file(run_python, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"one two three four five six seven eight nine ten\n" * 10)
    result = run_python(
        script=EXAMPLES / "train_tiny.py", arguments=("--steps", "1", "--file", str(corpus))
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ("--steps", "0"),
        ("--context", "-4"),
        ("--batch-size", "0"),
        ("--validation-fraction", "0"),
        ("--validation-batches", "0"),
        ("--eval-every", "0"),
        ("--loss-average-window", "0"),
        ("--vocab-size", "255"),
        ("--min-pair-frequency", "0"),
        ("--text", "a", "--file", "b"),
        ("--backend", "gpu"),
    ],
)
def test_train_tiny_rejects_bad_flags_through_argparse(run_python, arguments):
    result = run_python(script=EXAMPLES / "train_tiny.py", arguments=arguments)
    assert result.returncode == 2
    assert "error: argument" in result.stderr


@pytest.mark.skipif(backend_available("cuda"), reason="CUDA is available here")
def test_train_tiny_reports_an_unavailable_backend_without_a_traceback(run_python):
    result = run_python(script=EXAMPLES / "train_tiny.py", arguments=("--backend", "cuda"))
    assert result.returncode == 1
    assert result.stderr.startswith("train_tiny: backend_unavailable:")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_fine_tune_tiny_lowers_held_out_loss_and_merging_keeps_it(run_python, method):
    result = run_python(
        script=EXAMPLES / "fine_tune_tiny.py", arguments=("--fine-tuning-method", method)
    )
    assert result.returncode == 0, result.stderr
    summary = re.search(
        rf"^{method}: held-out loss ([0-9.]+) -> ([0-9.]+) \(after merge ([0-9.]+)\)",
        result.stdout,
        re.MULTILINE,
    )
    assert summary, result.stdout
    before, after, merged = map(float, summary.groups())
    assert after < before
    assert abs(merged - after) <= 2e-4
    if method == "qlora":
        packed = re.search(r"\(([0-9.]+)x\)", result.stdout)
        assert packed and float(packed.group(1)) < 0.15, result.stdout


def test_programmed_modular_addition_beats_learned_only_and_ablation_hurts(run_python):
    result = run_python(script=EXAMPLES / "programmed_modular_addition.py")
    assert result.returncode == 0, result.stderr
    accuracies = [float(a) for a in re.findall(r"held-out answer accuracy ([0-9.]+)", result.stdout)]
    assert len(accuracies) == 3, result.stdout
    learned, program, ablated = accuracies
    assert program > learned + 0.3
    assert ablated < program - 0.3
    assert "projected program input 1" in result.stdout


def test_serve_tiny_serves_the_chat_page_and_the_api_then_stops_after_max_requests():
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "serve_tiny.py"), "--port", "0", "--max-requests", "3",
         "--train-steps", "2", "--max-new-tokens", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_environment())
    try:
        deadline = time.monotonic() + 60
        line = ""
        while not line and time.monotonic() < deadline:
            if select.select([process.stdout], [], [], 0.5)[0]:
                line = process.stdout.readline()
            assert process.poll() is None or line, process.stderr.read()
        match = re.fullmatch(r"serve_tiny: serving riftco-tiny \((\w+) engine\) at "
                             r"(http://127\.0\.0\.1:\d+)/\n", line)
        assert match, line
        url = match[2]
        with urllib.request.urlopen(url + "/health", timeout=30) as response:
            assert json.load(response)["model"] == "riftco-tiny"
        request = urllib.request.Request(
            url + "/v1/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "hello"}],
                             "max_tokens": 8, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        assert body["object"] == "chat.completion"
        assert body["usage"]["completion_tokens"] <= 8
        with urllib.request.urlopen(url + "/", timeout=30) as response:
            assert b"<title>riftco-tiny chat</title>" in response.read()
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(10)
    assert process.returncode == 0, stderr
    assert stdout == "serve_tiny: stopped\n"


def test_serve_tiny_refuses_a_remote_host_without_allow_remote(run_python):
    result = run_python(script=EXAMPLES / "serve_tiny.py",
                        arguments=("--host", "0.0.0.0", "--train-steps", "0"))
    assert result.returncode == 2
    assert result.stderr.startswith("serve_tiny: host '0.0.0.0' is not a loopback address")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("arguments", [("--port", "70000"), ("--max-requests", "0"),
                                       ("--train-steps", "-1"), ("--kv-cache", "ring")])
def test_serve_tiny_rejects_bad_flags_through_argparse(run_python, arguments):
    result = run_python(script=EXAMPLES / "serve_tiny.py", arguments=arguments)
    assert result.returncode == 2
    assert "error: argument" in result.stderr
