"""``riftco``: the command line of the workflows (pretrain, post-train, evaluate, generate, serve).

Installed as a console script by ``pip install .``; from a source checkout,
``PYTHONPATH=python python3 -m riftco_transformer ...`` is the same program.

    riftco pretrain --file corpus.txt --output base.rift --steps 200
    riftco post-train --base base.rift --instructions chat.jsonl --output tuned.rift --method lora
    riftco evaluate --bundle tuned.rift --file held_out.txt
    riftco generate --bundle tuned.rift --prompt "What is 2 + 3?" --chat
    riftco serve --bundle tuned.rift --port 8000
    riftco chat --model SmolLM2-135M-Instruct.Q4_1.gguf
    riftco generate --model SmolLM2-135M-Instruct.Q4_1.gguf --prompt "Hi" --chat
    riftco inspect tuned.rift
    riftco convert tuned.rift tuned.safetensors
    riftco convert tuned.rift tuned.gguf --dtype f16
    riftco export run.riftckpt tuned-adapter --to peft
    riftco generate --bundle base.rift --adapter tuned-adapter --prompt "Hi" --chat
    riftco demo

Every subcommand's ``--help`` lists its flags with their defaults. Long runs draw a progress
bar (ETA, live loss, tokens/s) on a terminal and plain lines otherwise. Bad input is one
line on stderr, ``riftco <command>: error: ...``, and exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

EXIT_USAGE = 2


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every option's default in --help, those without a help text of their own included
    (not for flags that are off by default, options without one, or a help text that already
    says what its default is)."""

    @staticmethod
    def _shows_default(action: argparse.Action) -> bool:
        return (bool(action.option_strings) and not action.required
                and action.default is not None and action.default is not False
                and action.default is not argparse.SUPPRESS
                and "default" not in (action.help or ""))

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self._shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        if self._shows_default(action):
            text = f"{text} (default: %(default)s)".strip()
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) and defaults shown in --help."""

    def __init__(self, *arguments, **keywords) -> None:
        keywords.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*arguments, **keywords)

    def error(self, message: str) -> None:  # noqa: D102 (argparse's hook)
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_USAGE)


class UsageError(Exception):
    """A bad flag value found after parsing: reported like argparse's errors."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def _fraction_or_zero(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _dropout_probability(text: str) -> float:
    value = _non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {text}")
    return value


BACKENDS = ("auto", "cpu", "cuda", "metal", "tpu", "pjrt")


def _add_data_parallel(parser, command: str, batches: str) -> None:
    """--data-parallel, --collective-timeout and --zero-1 (read by _data_parallel_of)."""
    parser.add_argument("--data-parallel", action="store_true",
                        help=f"run as one rank of `mpirun -n R riftco {command} ...`: each rank "
                        f"trains on its shard of every global batch ({batches}), gradients "
                        "are averaged once per step; rank 0 writes the outputs (needs a library "
                        "built with RIFTCO_TRANSFORMER_ENABLE_MPI=ON)")
    parser.add_argument("--collective-timeout", type=_positive_float, default=120.0,
                        help="seconds a collective may wait for the other ranks before every "
                        "rank stops with an error (with --data-parallel)")
    parser.add_argument("--zero-1", action="store_true",
                        help="with --data-parallel: shard Adam's moments over the ranks "
                        "(ZeRO-1): each rank keeps and updates its share of the parameters, "
                        "the values are shared after every step; checkpoints hold the whole "
                        "state and resume with any world size")


def _add_backend(parser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="execution backend")


def _add_runtime_policies(parser) -> None:
    parser.add_argument("--attention", choices=("materialized", "flash"), default="materialized",
                        help="full-sequence attention kernel")
    parser.add_argument("--activation-checkpointing", choices=("disabled", "block"),
                        default="disabled", help="recompute each block in backward to save memory")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="riftco", description="Pretrain, fine-tune, evaluate and serve "
                     "decoder-only transformers.")
    from . import __version__
    from .native._abi import ABI_VERSION_MAJOR, ABI_VERSION_MINOR

    parser.add_argument("--version", action="version",
                        version=f"riftco-transformer {__version__} (C ABI "
                        f"{ABI_VERSION_MAJOR}.{ABI_VERSION_MINOR})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    pretrain = commands.add_parser("pretrain", help="pretrain a GPT on a text file",
                                   description="Fit a tokenizer on the training part of a UTF-8 "
                                   "file, pretrain a GPT on it and save a .rift bundle.")
    pretrain.add_argument("--file", type=Path, required=True, help="UTF-8 training text")
    pretrain.add_argument("--validation-file", type=Path, default=None,
                          help="explicit held-out text (else the file's tail is held out)")
    pretrain.add_argument("--output", type=Path, required=True, help="the .rift bundle to write")
    pretrain.add_argument("--steps", type=_positive_int, default=100, help="Adam steps")
    pretrain.add_argument("--context", type=_positive_int, default=32, help="tokens per window")
    pretrain.add_argument("--batch-size", type=_positive_int, default=4, help="windows per step")
    pretrain.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe")
    pretrain.add_argument("--vocab-size", type=_positive_int, default=272,
                          help="BPE vocabulary size (>= 256)")
    pretrain.add_argument("--min-pair-frequency", type=_positive_int, default=2)
    pretrain.add_argument("--architecture", default="gpt2",
                          choices=("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3",
                                   "phi3"),
                          help="the GPT decoder, or a rotary family's preset of the same size "
                               "(Mistral, Gemma 2, Gemma 3, Phi-3: a window of half the "
                               "context)")
    pretrain.add_argument("--model-width", type=_positive_int, default=16)
    pretrain.add_argument("--heads", type=_positive_int, default=4)
    pretrain.add_argument("--blocks", type=_positive_int, default=1)
    pretrain.add_argument("--feed-forward-width", type=_positive_int, default=32)
    pretrain.add_argument("--learning-rate", type=_positive_float, default=1e-2)
    pretrain.add_argument("--seed", type=_non_negative_int, default=7,
                          help="model initialisation and batch order")
    pretrain.add_argument("--validation-fraction", type=_fraction, default=0.1)
    pretrain.add_argument("--validation-batches", type=_positive_int, default=4)
    pretrain.add_argument("--eval-every", type=_positive_int, default=10)
    pretrain.add_argument("--tokenizer-training-bytes", type=_positive_int, default=16 << 20,
                          help="fit the tokenizer on at most this many bytes of training text")
    _add_backend(pretrain)
    _add_runtime_policies(pretrain)
    _add_training_outputs(pretrain)
    pretrain.add_argument("--checkpoint", type=Path, default=None,
                          help="write an exact-resume .riftckpt here during training")
    pretrain.add_argument("--checkpoint-every", type=_positive_int, default=50,
                          help="steps between checkpoints (with --checkpoint)")
    pretrain.add_argument("--resume", type=Path, default=None,
                          help="continue the run a .riftckpt recorded (same data and flags)")
    pretrain.add_argument("--auto-resume", action="store_true",
                          help="with --checkpoint: resume from it when the file exists (what "
                          "riftco launch's restarts rely on)")
    _add_data_parallel(pretrain, "pretrain", "--batch-size windows, a multiple of R")

    post = commands.add_parser("post-train", help="fine-tune a bundle on instruction JSONL",
                               description="Fine-tune a .rift bundle on prompt/response (or "
                               "messages) JSONL: full, LoRA or QLoRA; save the child bundle.")
    base = post.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", type=Path, help="the parent .rift bundle")
    base.add_argument("--model", type=Path,
                      help="a pretrained checkpoint (a GGUF file or Hugging Face directory of "
                      "a rotary family, or a bundle): trained in its own chat template; "
                      "the output bundle reopens with riftco chat --model")
    post.add_argument("--instructions", type=Path, required=True, help="training JSONL")
    held_out = post.add_mutually_exclusive_group()
    held_out.add_argument("--validation-instructions", type=Path, default=None,
                          help="held-out JSONL, scored before and after (exhaustively)")
    held_out.add_argument("--validation-fraction", type=_fraction, default=None,
                          help="hold out this fraction of --instructions instead (by content "
                          "hash, disjoint, deterministic)")
    post.add_argument("--output", type=Path, default=None,
                      help="the .rift bundle to write (the tuned model, LoRA merged); give "
                      "--output, --adapter-output or both")
    post.add_argument("--adapter-output", type=Path, default=None,
                      help="with --method lora or qlora: also (or only) save the trained adapter "
                      "alone, as a PEFT adapter directory (adapter_config.json and "
                      "adapter_model.safetensors under Hugging Face module names, plus the "
                      "base's identity) that --adapter and transformers+peft load onto the base")
    post.add_argument("--steps", type=_positive_int, default=None,
                      help="optimizer steps (default: enough for --epochs over the training "
                      "examples, ceil(epochs x examples / (batch size x accumulation)), at least "
                      "10 and at most 1000)")
    post.add_argument("--epochs", type=_positive_float, default=None,
                      help="passes over the training examples, instead of --steps (default: 3, "
                      "when --steps is not given; given, it is honoured without the floor and "
                      "cap)")
    post.add_argument("--method", choices=("full", "lora", "qlora"), default="full")
    post.add_argument("--weights", choices=_WEIGHT_CHOICES, default="f32",
                      help="with --model: the base's precision. f32 (default); file: QLoRA over "
                      f"{_FILE_BLOCKS}, never expanded to float32; {_CONVERSIONS}: packed into "
                      "that format first. A packed base needs --method qlora and keeps its "
                      "adapters unmerged: write them with --adapter-output (a bundle cannot "
                      "hold the blocks yet, nor can --checkpoint)")
    post.add_argument("--context", type=_positive_int, default=None,
                      help="the longest example row in tokens (default: the model's maximum "
                      "context); longer examples are handled as --overlong says")
    post.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                      help="what to do with an example longer than the context; the count is "
                      "reported")
    post.add_argument("--batch-size", type=_positive_int, default=2,
                      help="rows per micro-batch: examples, or packed rows with --packing")
    post.add_argument("--packing", action="store_true",
                      help="pack several examples into each row, each at its own positions and "
                      "attending only to itself (with --attention flash: CPU and PJRT)")
    post.add_argument("--gradient-accumulation", type=_positive_int, default=1,
                      help="micro-batches per optimizer step (with --data-parallel, "
                      "global micro-batches of --batch-size rows that the ranks share)")
    post.add_argument("--learning-rate", type=_positive_float, default=None,
                      help="peak learning rate (default: by method, 2e-5 full, 1e-4 lora and "
                      "qlora)")
    post.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"),
                      default="constant",
                      help="decay after the warmup")
    post.add_argument("--warmup-steps", type=_non_negative_int, default=None,
                      help="linear warmup steps, with --lr-schedule cosine or linear (default: "
                      "5%% of the steps, rounded up, with those schedules; 0 with constant)")
    post.add_argument("--min-lr-fraction", type=_fraction_or_zero, default=0.0,
                      help="the rate the decay ends at, as a fraction of the peak")
    post.add_argument("--weight-decay", type=_non_negative_float, default=0.0,
                      help="AdamW decoupled weight decay")
    post.add_argument("--seed", type=_non_negative_int, default=29,
                      help="batch order")
    post.add_argument("--lora-rank", type=_positive_int, default=4)
    post.add_argument("--lora-alpha", type=_positive_float, default=8.0)
    post.add_argument("--rslora", action="store_true",
                      help="rank-stabilized LoRA: scale the update by alpha/sqrt(rank) instead of "
                      "alpha/rank")
    post.add_argument("--lora-dropout", type=_dropout_probability, default=0.0,
                      help="dropout probability on the adapters' input while training, in [0, 1) "
                      "(default: 0, none; PEFT's lora_dropout; evaluation and generation apply "
                      "none)")
    post.add_argument("--lora-targets", default=None,
                      help="'all-linear' (every projection of every block, not the head) or "
                      "comma-separated projection names, e.g. attention.query,attention.value "
                      "(default: attention.query,attention.value with --base, all-linear with "
                      "--model)")
    post.add_argument("--nf4-block-size", type=_positive_int, default=64)
    loss = post.add_mutually_exclusive_group()
    loss.add_argument("--response-only", action="store_true",
                      help="compute the loss on the assistant's tokens only (the default)")
    loss.add_argument("--full-sequence-loss", action="store_true",
                      help="compute the loss on every token of the formatted examples")
    post.add_argument("--eval-every", type=_positive_int, default=10,
                      help="steps between validation losses (with held-out examples) and "
                      "generation checks")
    post.add_argument("--early-stopping-patience", type=_positive_int, default=None,
                      help="stop after this many validations without a new best, and keep "
                      "the best model (needs held-out examples)")
    post.add_argument("--generation-checks", type=Path, default=None,
                      help="JSONL of held-out prompts, each with {\"expect\": exact text} or "
                      "{\"match\": regex}: the model answers them greedily in its chat "
                      "template before training, every --eval-every steps and at the end; "
                      "pass counts go to the output and the metrics JSONL")
    post.add_argument("--generation-max-new-tokens", type=_positive_int, default=64,
                      help="the response length of a generation check that sets no "
                      "max_new_tokens")
    _add_backend(post)
    _add_runtime_policies(post)
    _add_training_outputs(post)
    post.add_argument("--checkpoint", type=Path, default=None,
                      help="write an exact-resume .riftckpt here during training")
    post.add_argument("--checkpoint-every", type=_positive_int, default=50,
                      help="steps between checkpoints (with --checkpoint)")
    post.add_argument("--resume", type=Path, default=None,
                      help="continue the run a .riftckpt recorded (same base, data and flags)")
    post.add_argument("--auto-resume", action="store_true",
                      help="with --checkpoint: resume from it when the file exists (what riftco "
                      "launch's restarts rely on)")
    _add_data_parallel(post, "post-train",
                       "--batch-size rows, a multiple of R; with --gradient-accumulation, "
                       "each micro-batch")

    evaluate = commands.add_parser("evaluate", help="score a bundle on held-out data",
                                   description="Exhaustive held-out scoring: every target "
                                   "token scored exactly once; loss and perplexity.")
    _add_model_source(evaluate)
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="a UTF-8 text")
    source.add_argument("--instructions", type=Path, help="instruction JSONL")
    evaluate.add_argument("--context", type=_positive_int, default=None,
                          help="chunk width (default: the model's maximum context)")
    evaluate.add_argument("--batch-size", type=_positive_int, default=8)
    evaluate.add_argument("--response-only", action="store_true",
                          help="with --instructions: score the assistant's tokens only")
    evaluate.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_backend(evaluate)

    generate = commands.add_parser("generate", help="continue a prompt",
                                   description="Generate text from a bundle (KV-cached decode), "
                                   "streaming it to stdout.")
    _add_model_source(generate)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--max-new-tokens", type=_non_negative_int, default=64)
    generate.add_argument("--chat", action="store_true",
                          help="wrap the prompt in the model's chat template (a bundle's: the "
                          "plain one); stop at the end of the assistant's turn")
    _add_sampling(generate)
    _add_backend(generate)

    serve = commands.add_parser("serve", help="serve a bundle over HTTP",
                                description="HTTP: chat page, /v1/generate, OpenAI-compatible "
                                "/v1/completions and /v1/chat/completions.")
    _add_model_source(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000, help="0 picks a free port")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --host (no authentication, no TLS)")
    serve.add_argument("--max-new-tokens", type=_positive_int, default=None,
                       help="the most tokens one request may generate (default: what the "
                       "model's context leaves after the prompt)")
    serve.add_argument("--kv-cache", choices=("paged", "contiguous"), default="paged")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1/* and /metrics "
                       "(default: $RIFTCO_API_KEY when set, else no key)")
    serve.add_argument("--max-requests", type=_positive_int, default=None,
                       help="exit after this many requests")
    serve.add_argument("--max-connections", type=_positive_int, default=128,
                       help="connections served at once; one more is answered 503")
    _add_backend(serve)

    chat = commands.add_parser("chat", help="chat with a model in the terminal",
                               description="Interactive chat with streaming output. The model "
                               "is a GGUF file, a Hugging Face directory or a .rift bundle; its "
                               "chat template renders the conversation. Type /reset to start over, "
                               "/exit (or end of input) to quit.")
    chat.add_argument("--model", type=Path, required=True,
                      help="a GGUF file or a .rift bundle")
    _add_adapter(chat)
    _add_weights(chat)
    chat.add_argument("--system", default=None, help="a system message for the conversation")
    chat.add_argument("--max-new-tokens", type=_positive_int, default=256)
    _add_sampling(chat)
    chat.add_argument("--maximum-context", type=_positive_int, default=2048,
                      help="longest conversation in tokens (bounds the KV cache)")

    inspect = commands.add_parser("inspect", help="summarise a bundle, checkpoint, GGUF file, "
                                  "Hugging Face directory or PEFT adapter",
                                  description="Validate a .rift bundle or .riftckpt checkpoint "
                                  "and print its summary; or summarise a GGUF file (from its "
                                  "metadata), a Hugging Face directory (config and tensor "
                                  "headers) or a PEFT adapter directory (adapter_config.json "
                                  "and tensor headers).")
    inspect.add_argument("path", type=Path)
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")

    convert = commands.add_parser("convert", aliases=["export"],
                                  help="bundle <-> safetensors F32; bundle -> GGUF or a Hugging "
                                  "Face directory; LoRA checkpoint -> PEFT adapter",
                                  description="Convert a .rift bundle to safetensors F32 (names, "
                                  "shapes, and the bundle's manifest in __metadata__) or back; "
                                  "or a rotary-family bundle (Llama, Mistral, Qwen 2/3, Gemma "
                                  "2/3, Phi-3) to GGUF for llama.cpp, Ollama and LM Studio, or to "
                                  "a Hugging Face directory (--to hf) for transformers; or the "
                                  ".riftckpt checkpoint of a LoRA/QLoRA run to a PEFT adapter "
                                  "directory (--to peft) for transformers+peft and --adapter.")
    convert.add_argument("source", type=Path)
    convert.add_argument("destination", type=Path)
    convert.add_argument("--from", dest="source_format", choices=("rift", "safetensors"),
                         default=None, help="source format (default: from the file's content)")
    convert.add_argument("--to", dest="destination_format",
                         choices=CONVERT_DESTINATION_FORMATS, default=None,
                         help="destination format (default: from the destination's extension, "
                         ".rift, .safetensors or .gguf; a Hugging Face directory needs --to hf, "
                         "a PEFT adapter directory --to peft)")
    convert.add_argument("--dtype", choices=("f32", "f16", "bf16", "q8_0", "q4_0"), default=None,
                         help="weight type of a GGUF file (f32; f16: every matrix rounded to "
                         "nearest even; q8_0, q4_0: every matrix in ggml's blocks of 32, a "
                         "matrix whose rows are not a multiple of 32 in f16; norms and biases "
                         "stay f32) or a Hugging Face directory (f32, f16, bf16); default f32")
    convert.add_argument("--base-model", default=None,
                         help="with --to peft: the base_model_name_or_path adapter_config.json "
                         "records (the base's Hugging Face directory or hub id)")

    launch = commands.add_parser(
        "launch", help="run a command on N ranks under mpirun, restarting on failure",
        description="Run COMMAND on N ranks (mpirun -n N COMMAND). When a rank dies, every rank "
        "ends; the launcher says why and restarts them all, up to --max-restarts times. Use "
        "riftco pretrain/post-train --checkpoint PATH --auto-resume so a restart continues "
        "from the last checkpoint.")
    launch.add_argument("-n", "--ranks", type=_positive_int, required=True,
                        help="number of ranks")
    launch.add_argument("--max-restarts", type=_non_negative_int, default=0,
                        help="restarts after a failure")
    launch.add_argument("--mpirun", default=None,
                        help="the mpirun to use (default: $MPIEXEC, else mpirun on PATH)")
    launch.add_argument("--mpirun-arg", action="append", default=[], dest="mpirun_arguments",
                        metavar="ARGUMENT",
                        help="an argument for mpirun, before the command (repeatable), e.g. "
                        "--mpirun-arg=--oversubscribe")
    launch.add_argument("launched", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command and its arguments")

    demo = commands.add_parser("demo", help="the whole journey on bundled data",
                               description="Pretrain on the bundled corpus, post-train on the "
                               "bundled instructions, evaluate, and generate.")
    demo.add_argument("--output-dir", type=Path, default=None,
                      help="where the bundles go (default: a new temporary directory)")
    demo.add_argument("--steps", type=_positive_int, default=300, help="pretraining steps")
    demo.add_argument("--post-train-steps", type=_positive_int, default=None,
                      help="post-training steps (default: 8 epochs of the 39 training examples "
                      "at 8 rows a step, 39 steps; validation every 5 steps stops the run early "
                      "when the held-out loss stops improving)")
    _add_backend(demo)
    return parser


def _add_model_source(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bundle", type=Path, help="a .rift bundle")
    source.add_argument("--model", type=Path,
                        help="a pretrained checkpoint: a GGUF file, a Hugging Face directory "
                        "or a .rift bundle")
    _add_adapter(parser)
    _add_weights(parser)


# --weights (load_pretrained's choices, pretrained.WEIGHT_CHOICES, spelled out so that
# building the parser imports nothing).
_WEIGHT_CHOICES = ("f32", "file", "q8_0", "q5_0", "q4_1", "q4_0", "bf16", "f16")
_FILE_BLOCKS = "the GGUF file's own blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, F16, BF16)"
_CONVERSIONS = "/".join(_WEIGHT_CHOICES[2:])


def _add_weights(parser) -> None:
    parser.add_argument("--weights", choices=_WEIGHT_CHOICES, default="f32",
                        help=f"the projections' precision: f32 (default); file: {_FILE_BLOCKS} "
                        f"and packed embedding table, never expanded; {_CONVERSIONS}: packed "
                        "into that format after loading. With packed weights an --adapter "
                        "stays attached, unmerged")


def _add_adapter(parser) -> None:
    parser.add_argument("--adapter", type=Path, default=None,
                        help="a PEFT LoRA adapter directory (riftco post-train --adapter-output, "
                        "riftco export --to peft, or PEFT's save_pretrained) to apply to the "
                        "model: attached, checked against it, then merged into its weights")
    parser.add_argument("--skip-adapter-base-check", action="store_true",
                        help="apply --adapter even when the base it records (riftco's adapters "
                        "record theirs) cannot be shown to be this model")


def _open_model(arguments, maximum_context: int | None = None):
    """The PretrainedModel that --bundle or --model names (with --adapter applied and merged),
    on the requested backend."""
    from .pretrained import checkpoint_format, load_pretrained

    path = arguments.bundle if getattr(arguments, "bundle", None) is not None else arguments.model
    adapter = getattr(arguments, "adapter", None)  # post-train --model takes none
    skip_check = getattr(arguments, "skip_adapter_base_check", False)
    if skip_check and adapter is None:
        raise UsageError("--skip-adapter-base-check needs --adapter")
    weights = getattr(arguments, "weights", "f32")
    # load_pretrained's own rule (the same test of the file), named as the flag here.
    if weights == "file" and checkpoint_format(path) != "gguf":
        raise UsageError(f"--weights file keeps a GGUF file's blocks; {path} is not a .gguf "
                         "file (choose f32, q8_0, q5_0, q4_1, q4_0, bf16 or f16)")
    loaded = load_pretrained(path, maximum_context=maximum_context, adapter=adapter,
                             check_adapter_base=not skip_check, weights=weights)
    try:
        if adapter is not None and weights == "f32":
            loaded.model.merge_lora()  # served at the base's speed, as PEFT's merge_and_unload
        backend = _backend(arguments) if hasattr(arguments, "backend") else "cpu"
        if backend != "cpu":
            loaded.model.to(backend)
    except BaseException:
        loaded.close()
        raise
    return loaded


def _add_training_outputs(parser) -> None:
    parser.add_argument("--metrics", type=Path, default=None,
                        help="metrics JSONL (default: <output>.metrics.jsonl)")
    parser.add_argument("--loss-curve", type=Path, default=None,
                        help="SVG loss curve (default: <output>.loss.svg)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or lines")


# ---- commands -----------------------------------------------------------------------------


def _backend(arguments) -> str:
    """The --backend flag with "auto" resolved (tpu, cuda, metal, then cpu; never pjrt)."""
    from .pretraining import resolve_backend

    return resolve_backend(arguments.backend)


def _say(message: str) -> None:
    print(message, flush=True)


class _TrainingReporter:
    """Metrics JSONL + SVG curve + progress bar for one training command. The files are
    created with the first metric, so a run that fails before training leaves none."""

    def __init__(self, arguments, total_steps: int, label: str, initial: int = 0,
                 resuming: bool = False) -> None:
        from .reporting import LossCurveSink, ProgressBar

        output = arguments.output
        if output is None:  # post-train saving only the adapter: the files go beside it
            output = arguments.adapter_output
        self.metrics_path = arguments.metrics or output.with_name(output.name + ".metrics.jsonl")
        self.curve_path = arguments.loss_curve or output.with_name(output.name + ".loss.svg")
        self.jsonl = None
        self.curve = LossCurveSink(title=f"{label}: {output.name}")
        self.append = False
        if resuming and self.metrics_path.is_file():
            self._keep_metrics_up_to(initial)
        self.bar = None if arguments.no_progress else ProgressBar(
            total_steps, label=label, initial=initial
        )
        self.validation_loss = None

    def _keep_metrics_up_to(self, step: int) -> None:
        """A resumed run continues the interrupted run's metrics file: its records up to the
        checkpoint's step are kept (later ones were trained again), and the curve redrawn."""
        import types

        from ._files import atomic_write_bytes

        kept = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and \
                    record["step"] <= step and \
                    record.get("phase") in ("train", "validation", "generation"):
                kept.append(line)
                values = {key: float(value) if key in ("loss", "perplexity")
                          and isinstance(value, str) else value for key, value in record.items()}
                self.curve(types.SimpleNamespace(**values))
        atomic_write_bytes(self.metrics_path, "".join(f"{line}\n" for line in kept).encode())
        self.append = True

    def sink(self, metric) -> None:
        if self.jsonl is None:
            from .reporting import JsonlMetricSink

            self.jsonl = JsonlMetricSink(self.metrics_path, append=self.append)
        self.jsonl(metric)
        self.curve(metric)
        if metric.phase == "validation":
            self.validation_loss = metric.loss
        elif metric.phase == "generation":
            _say(f"post-train: generation checks at step {metric.step}: {metric.summary}")

    def on_step(self, metric) -> None:
        if self.bar is not None:
            fields = {"loss": metric.loss}
            if metric.tokens_per_second:
                fields["tokens_per_second"] = metric.tokens_per_second
            if self.validation_loss is not None:
                fields["validation_loss"] = self.validation_loss
            self.bar.update(metric.step, **fields)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl is not None:
            self.jsonl.close()
            self.curve.write(self.curve_path)


def _apply_auto_resume(arguments) -> None:
    """--auto-resume: --resume the --checkpoint file when it exists (a restarted run)."""
    if not arguments.auto_resume:
        return
    if arguments.checkpoint is None:
        raise UsageError("--auto-resume needs --checkpoint (the file to resume from)")
    if arguments.resume is not None:
        raise UsageError("--auto-resume and --resume exclude each other")
    if arguments.checkpoint.is_file():
        arguments.resume = arguments.checkpoint
        _say(f"riftco {arguments.command}: resuming from {arguments.checkpoint}")


def command_pretrain(arguments) -> int:
    from .pretraining import PretrainingConfig, pretrain_file

    _apply_auto_resume(arguments)
    config = PretrainingConfig(
        steps=arguments.steps, context_size=arguments.context, batch_size=arguments.batch_size,
        validation_fraction=arguments.validation_fraction,
        validation_batch_count=arguments.validation_batches,
        evaluation_interval=arguments.eval_every, tokenizer_method=arguments.tokenizer,
        vocabulary_size=arguments.vocab_size, minimum_pair_frequency=arguments.min_pair_frequency,
        model_width=arguments.model_width, head_count=arguments.heads,
        block_count=arguments.blocks, feed_forward_width=arguments.feed_forward_width,
        learning_rate=arguments.learning_rate, random_seed=arguments.seed,
        backend=arguments.backend, attention=arguments.attention,
        activation_checkpointing=arguments.activation_checkpointing,
        tokenizer_training_bytes=arguments.tokenizer_training_bytes,
        architecture=arguments.architecture,
    )
    initial = 0
    if arguments.resume is not None:
        from .checkpoints import TrainingCheckpoint

        checkpoint = TrainingCheckpoint.load(arguments.resume)
        initial = checkpoint.global_step
        resume = checkpoint
    else:
        resume = None
    data_parallel = _data_parallel_of(arguments)
    leader = data_parallel is None or data_parallel.rank == 0
    if leader:
        reporter = _TrainingReporter(arguments, config.steps, "pretrain", initial,
                                     resuming=resume is not None)
        sink, on_step = reporter.sink, reporter.on_step
    else:  # the other ranks write nothing and stay quiet
        reporter, sink, on_step = None, None, None
    started = time.perf_counter()
    try:
        result = pretrain_file(
            arguments.file, config, arguments.validation_file,
            metric_sink=sink, on_step=on_step,
            checkpoint_path=arguments.checkpoint, checkpoint_interval=arguments.checkpoint_every,
            resume_from=resume, data_parallel=data_parallel,
        )
    finally:
        if reporter is not None:
            reporter.finish()
    elapsed = time.perf_counter() - started
    if not leader:
        data_parallel.group.barrier()  # rank 0 has written the bundle when this returns
        return 0
    result.bundle.save(arguments.output)
    trained = [m for m in result.metrics if m.phase == "train"]
    validation = [m for m in result.metrics if m.phase == "validation"]
    tokens = sum(config.batch_size * config.context_size for _ in trained)
    _say(f"pretrain: {len(trained)} steps in {elapsed:.1f} s ({tokens / elapsed:,.0f} tokens/s); "
         f"{result.training_token_count:,} training and {result.validation_token_count:,} "
         "validation tokens")
    if validation:
        _say(f"pretrain: validation loss {validation[0].loss:.4f} -> {validation[-1].loss:.4f} "
             f"(perplexity {validation[-1].perplexity:.2f})")
    if data_parallel is not None:
        moved, seconds = data_parallel.group.communication
        _say(f"pretrain: data parallel over {data_parallel.world_size} ranks; {moved:,} bytes "
             f"through collectives in {seconds:.2f} s ({100 * seconds / elapsed:.1f}% of the run)")
    _say(f"pretrain: wrote {arguments.output} (artifact {result.bundle.artifact_id[:16]}), "
         f"{reporter.metrics_path}, {reporter.curve_path}")
    if data_parallel is not None:
        data_parallel.group.barrier()
    return 0


def _data_parallel_of(arguments):
    """The DataParallel of --data-parallel (and --zero-1, --collective-timeout), or None."""
    if arguments.zero_1 and not arguments.data_parallel:
        raise UsageError("--zero-1 needs --data-parallel")
    if not arguments.data_parallel:
        return None
    from .distributed import DataParallel, ProcessGroup

    return DataParallel(ProcessGroup(timeout=arguments.collective_timeout),
                        shard_optimizer=arguments.zero_1)


def command_post_train(arguments) -> int:
    data_parallel = _data_parallel_of(arguments)
    if data_parallel is None or data_parallel.rank == 0:
        return _post_train_command(arguments, data_parallel)
    # The other ranks stay quiet (rank 0 says it all); their errors still go to stderr.
    import contextlib

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        return _post_train_command(arguments, data_parallel)


def _post_train_reporter(arguments, config, resume, data_parallel):
    """The metrics, curve and progress of a post-train run on rank 0 (or alone), as
    (reporter, sink, on_step); the other ranks write nothing: (None, None, None)."""
    if data_parallel is not None and data_parallel.rank != 0:
        return None, None, None
    reporter = _TrainingReporter(arguments, config.steps,
                                 f"post-train ({config.fine_tuning_method})",
                                 0 if resume is None else resume.global_step,
                                 resuming=resume is not None)
    return reporter, reporter.sink, reporter.on_step


def _report_data_parallel(data_parallel, elapsed: float) -> None:
    if data_parallel is not None:
        moved, seconds = data_parallel.group.communication
        _say(f"post-train: data parallel over {data_parallel.world_size} ranks; {moved:,} bytes "
             f"through collectives in {seconds:.2f} s "
             f"({100 * seconds / max(elapsed, 1e-9):.1f}% of the run)")


def _require_post_train_outputs(arguments) -> None:
    """--output and/or --adapter-output, each usable, before anything is read or trained."""
    if arguments.output is None and arguments.adapter_output is None:
        raise UsageError("give --output (the tuned bundle), --adapter-output (the adapter alone, "
                         "a PEFT directory) or both")
    if arguments.adapter_output is None:
        return
    if arguments.method == "full":
        raise UsageError("--adapter-output needs --method lora or qlora (a full fine-tune "
                         "trains no adapter)")
    _require_directory_name(arguments.adapter_output, "--adapter-output")
    from .interchange.huggingface_export import _require_free

    _require_free(arguments.adapter_output, "--adapter-output")


def _save_adapter(arguments, result, base: Path) -> None:
    """--adapter-output: the run's adapter as a PEFT directory (its base named by path)."""
    if arguments.adapter_output is None:
        return
    result.adapter.save(arguments.adapter_output, base_model_name_or_path=str(base))
    recorded = ", ".join(f"{key} {value[:16]}" for key, value in result.adapter.base.items())
    _say(f"post-train: wrote the adapter alone to {arguments.adapter_output} (PEFT, r="
         f"{result.adapter.lora.rank}; base {recorded or 'not recorded'})")


def _scaled_schedule(arguments, example_count: int):
    """--steps, --learning-rate and --warmup-steps, each given or scaled to the method and the
    training examples (post_training.scaled_defaults); the chosen values and why are printed."""
    from .post_training import scaled_defaults

    chosen = scaled_defaults(arguments.method, example_count, arguments.batch_size,
                             arguments.gradient_accumulation, steps=arguments.steps,
                             epochs=arguments.epochs, learning_rate=arguments.learning_rate,
                             lr_schedule=arguments.lr_schedule,
                             warmup_steps=arguments.warmup_steps)
    _say(f"post-train: {chosen.describe()}")
    return chosen


def _post_train_command(arguments, data_parallel) -> int:
    _apply_auto_resume(arguments)
    if arguments.steps is not None and arguments.epochs is not None:
        raise UsageError("give --steps or --epochs, not both")
    if arguments.weights != "f32":
        packed = f"--weights {arguments.weights}"
        if arguments.model is None:
            raise UsageError(f"{packed} applies to --model (a pretrained checkpoint)")
        if arguments.method != "qlora":
            raise UsageError(f"{packed} trains adapters over packed blocks: it needs --method "
                             f"qlora (not {arguments.method})")
        if arguments.output is not None:
            raise UsageError(f"{packed} keeps the adapters unmerged over packed blocks, which a "
                             ".rift bundle cannot hold yet: write --adapter-output instead of "
                             "--output")
        if arguments.checkpoint is not None or arguments.resume is not None:
            raise UsageError(f"{packed}: checkpoints cannot hold packed blocks yet (drop "
                             "--checkpoint/--resume, or train with --weights f32)")
    _require_post_train_outputs(arguments)
    from .artifacts import ModelBundle
    from .instructions import read_instructions_jsonl
    from .native import LoraConfig
    from .post_training import PostTrainingConfig, post_train

    examples = read_instructions_jsonl(arguments.instructions)
    validation = (
        read_instructions_jsonl(arguments.validation_instructions)
        if arguments.validation_instructions is not None else None
    )
    checks = None
    if arguments.generation_checks is not None:
        from .generation_checks import read_generation_checks_jsonl

        checks = read_generation_checks_jsonl(arguments.generation_checks,
                                              arguments.generation_max_new_tokens)
    if arguments.validation_fraction is not None:
        from .instructions import split_examples

        splits = split_examples(examples, arguments.validation_fraction, seed=arguments.seed)
        examples, validation = splits.train, splits.validation
        _say(f"post-train: {len(examples)} training and {len(validation)} held-out examples "
             f"(validation fraction {arguments.validation_fraction})")
    # --model resolves its targets once loaded; a --base bundle's feed-forward is its config's
    # (the GPT preset's is plain).
    base = None if arguments.model is not None else ModelBundle.load(arguments.base)
    base_targets = None if base is None else _lora_targets(
        arguments.lora_targets, getattr(base.config, "feed_forward", "plain"))
    schedule = _scaled_schedule(arguments, len(examples))
    config = PostTrainingConfig(
        steps=schedule.steps, context_size=arguments.context, batch_size=arguments.batch_size,
        evaluation_interval=arguments.eval_every, learning_rate=schedule.learning_rate,
        random_seed=arguments.seed, backend=arguments.backend,
        fine_tuning_method=arguments.method, overlong=arguments.overlong,
        packing=arguments.packing,
        lora=LoraConfig(rank=arguments.lora_rank, alpha=arguments.lora_alpha,
                        rank_stabilized=arguments.rslora, dropout=arguments.lora_dropout,
                        **({} if base_targets is None else {"targets": base_targets})),
        attention=arguments.attention, activation_checkpointing=arguments.activation_checkpointing,
        nf4_block_size=arguments.nf4_block_size,
        response_only_loss=not arguments.full_sequence_loss,
        lr_schedule=arguments.lr_schedule, warmup_steps=schedule.warmup_steps,
        minimum_learning_rate_fraction=arguments.min_lr_fraction,
        weight_decay=arguments.weight_decay,
        gradient_accumulation_steps=arguments.gradient_accumulation,
        early_stopping_patience=arguments.early_stopping_patience,
    )
    if config.early_stopping_patience is not None and validation is None:
        raise UsageError("--early-stopping-patience needs held-out examples "
                         "(--validation-instructions or --validation-fraction)")
    if arguments.adapter_output is not None and base is not None:
        from .interchange.peft import require_peft_exportable

        require_peft_exportable(base.config, config.lora)
    if arguments.model is not None:
        return _post_train_pretrained(arguments, examples, validation, config, data_parallel,
                                      checks)
    resume = None
    if arguments.resume is not None:
        from .checkpoints import TrainingCheckpoint

        resume = TrainingCheckpoint.load(arguments.resume)
    reporter, sink, on_step = _post_train_reporter(arguments, config, resume, data_parallel)
    started = time.perf_counter()
    try:
        result = post_train(base, examples, config, metric_sink=sink, on_step=on_step,
                            validation_examples=validation, checkpoint_path=arguments.checkpoint,
                            checkpoint_interval=arguments.checkpoint_every, resume_from=resume,
                            data_parallel=data_parallel, generation_checks=checks)
    finally:
        if reporter is not None:
            reporter.finish()
    elapsed = time.perf_counter() - started
    if reporter is None:  # another rank than 0: it writes nothing
        data_parallel.group.barrier()  # rank 0 has written the bundle when this returns
        return 0
    if arguments.output is not None:
        result.bundle.save(arguments.output)
    trained = [m for m in result.metrics if m.phase == "train"]
    losses = (f"; training loss {trained[0].loss:.4f} -> {trained[-1].loss:.4f}"
              if trained else "")
    _say(f"post-train: {config.fine_tuning_method}, {result.example_count} examples, "
         f"{len(trained)} steps in {elapsed:.1f} s{losses} ({result.objective})")
    _report_data_and_stopping(result)
    if result.base_validation is not None:
        _say(f"post-train: held-out loss {result.base_validation.loss:.4f} (base) -> "
             f"{result.tuned_validation.loss:.4f} (tuned), delta "
             f"{result.tuned_validation.loss - result.base_validation.loss:+.4f}")
    _report_generation(result)
    _report_data_parallel(data_parallel, elapsed)
    if arguments.output is not None:
        _say(f"post-train: wrote {arguments.output} (artifact {result.bundle.artifact_id[:16]}, "
             f"parent {base.artifact_id[:16]})")
    _save_adapter(arguments, result, arguments.base)
    if data_parallel is not None:
        data_parallel.group.barrier()
    return 0


def _report_generation(result) -> None:
    """The generation checks' pass counts before and after training."""
    if result.tuned_generation is not None:
        _say(f"post-train: generation checks {result.base_generation.passed}/"
             f"{result.base_generation.total} (base) -> {result.tuned_generation.summary} "
             "(tuned)")


def _report_data_and_stopping(result) -> None:
    """What the data handling did to the examples, and whether early stopping ended the run."""
    data = result.data
    if data is not None:
        _say(f"post-train: data: {data['used_example_count']} of {data['example_count']} examples "
             f"trained whole, {'packed into rows' if data.get('packing') else 'one per row'} "
             f"of at most {data['context_size'] + 1} tokens; "
             f"{data['truncated_count']} truncated to the context, {data['dropped_count']} "
             f"dropped as too long, {data['unusable_count']} left with no target; "
             f"{data['target_token_count']} target tokens per epoch")
    if result.stopped_early:
        _say(f"post-train: stopped early (no better validation loss in the patience window); "
             f"kept the best model, from step {result.best_step}")
    elif result.best_step is not None:
        _say(f"post-train: kept the best validation's model, from step {result.best_step}")


_ATTENTION_PROJECTIONS = ("attention.query", "attention.key", "attention.value",
                          "attention.output")
# The feed-forward's projections, by the decoder's feed_forward choice.
_FEED_FORWARD_PROJECTIONS = {"gated": ("feed_forward.gate", "feed_forward.up",
                                       "feed_forward.down"),
                             "plain": ("feed_forward.expand", "feed_forward.project")}


def _all_projections(model) -> tuple[str, ...]:
    """Every block projection of ``model`` (a rotary-path decoder of any preset) by name."""
    return _ATTENTION_PROJECTIONS + _FEED_FORWARD_PROJECTIONS[model.config.feed_forward]


def _lora_targets(text: str | None, feed_forward: str) -> tuple[str, ...] | None:
    """--lora-targets: None (the command's default), 'all-linear' (every block projection of a
    decoder with this feed-forward kind; PEFT's name for it), or comma-separated names."""
    if text is None:
        return None
    if text.strip() == "all-linear":
        return _ATTENTION_PROJECTIONS + _FEED_FORWARD_PROJECTIONS[feed_forward]
    names = tuple(name.strip() for name in text.split(","))
    from .native.lora import LORA_TARGETS

    unknown = [name for name in names if name not in LORA_TARGETS]
    if unknown or not names:
        raise UsageError(f"--lora-targets: unknown projection {unknown[0] if unknown else text!r}"
                         f"; use all-linear or names from {', '.join(LORA_TARGETS)}")
    return names


def _post_train_pretrained(arguments, examples, validation, config, data_parallel,
                           checks=None) -> int:
    """post-train --model: fine-tune a pretrained checkpoint in its own chat template."""
    import dataclasses

    from .native import LoraConfig
    from .post_training import fine_tune_pretrained

    resume = None
    if arguments.resume is not None:
        from .checkpoints import TrainingCheckpoint

        resume = TrainingCheckpoint.load(arguments.resume)
    from .interchange.peft import source_identity

    base_id = source_identity(arguments.model)
    loaded = _open_model(arguments)
    with loaded:
        if loaded.architecture == "gpt":
            raise UsageError("--model takes a pretrained (rotary-family) checkpoint; use --base "
                             "for a GPT bundle")
        # Adapters on every projection of the blocks (the GPT default, q and v, leaves most
        # of a Llama block frozen).
        targets = _lora_targets(arguments.lora_targets, loaded.model.config.feed_forward)
        config = dataclasses.replace(config, lora=LoraConfig(
            rank=arguments.lora_rank, alpha=arguments.lora_alpha,
            rank_stabilized=arguments.rslora, dropout=arguments.lora_dropout,
            targets=_all_projections(loaded.model) if targets is None else targets))
        if arguments.adapter_output is not None:
            from .interchange.peft import require_peft_exportable

            require_peft_exportable(loaded.model.config, config.lora)
        reporter, sink, on_step = _post_train_reporter(arguments, config, resume, data_parallel)
        started = time.perf_counter()
        try:
            result = fine_tune_pretrained(loaded, examples, config, metric_sink=sink,
                                          on_step=on_step, validation_examples=validation,
                                          checkpoint_path=arguments.checkpoint,
                                          checkpoint_interval=arguments.checkpoint_every,
                                          resume_from=resume, base_id=base_id,
                                          data_parallel=data_parallel,
                                          generation_checks=checks)
        finally:
            if reporter is not None:
                reporter.finish()
        elapsed = time.perf_counter() - started
        if reporter is None:  # another rank than 0: it writes nothing
            data_parallel.group.barrier()  # rank 0 has written the bundle when this returns
            return 0
        metadata = {"source": str(arguments.model), "fine_tuning_method": config.fine_tuning_method,
                    "objective": config.objective, "example_count": result.example_count,
                    "data": result.data, "stopped_early": result.stopped_early,
                    "best_step": result.best_step}
        if result.base_validation is not None:
            metadata["validation"] = {"base_loss": result.base_validation.loss,
                                      "tuned_loss": result.tuned_validation.loss}
        if result.tuned_generation is not None:
            metadata["generation_checks"] = {"total": result.tuned_generation.total,
                                             "base_passed": result.base_generation.passed,
                                             "tuned_passed": result.tuned_generation.passed}
        bundle = (None if arguments.output is None else
                  loaded.save(arguments.output, stage="post_training", metadata=metadata))
    trained = [m for m in result.metrics if m.phase == "train"]
    losses = (f"; training loss {trained[0].loss:.4f} -> {trained[-1].loss:.4f}"
              if trained else "")
    _say(f"post-train: {config.fine_tuning_method} of {arguments.model.name}, "
         f"{result.example_count} examples, {len(trained)} steps in {elapsed:.1f} s{losses}")
    _report_data_and_stopping(result)
    if result.base_validation is not None:
        _say(f"post-train: held-out loss {result.base_validation.loss:.4f} (base) -> "
             f"{result.tuned_validation.loss:.4f} (tuned), delta "
             f"{result.tuned_validation.loss - result.base_validation.loss:+.4f}")
    _report_generation(result)
    _report_data_parallel(data_parallel, elapsed)
    if bundle is not None:
        _say(f"post-train: wrote {arguments.output} (artifact {bundle.artifact_id[:16]})")
    _save_adapter(arguments, result, arguments.model)
    if data_parallel is not None:
        data_parallel.group.barrier()
    return 0


def command_evaluate(arguments) -> int:
    from .artifacts import ModelBundle
    from .evaluation import evaluate_instruction_examples, evaluate_text

    del ModelBundle
    with _open_model(arguments) as loaded:
        if arguments.file is not None:
            data = arguments.file.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{arguments.file}: not UTF-8 at byte {error.start}") from None
            result = evaluate_text(loaded.model, loaded.tokenizer, data, arguments.context,
                                   arguments.batch_size)
        else:
            from .instructions import ChatTemplateFormatter, read_instructions_jsonl

            examples = read_instructions_jsonl(arguments.instructions)
            formatter = (None if loaded.architecture == "gpt"
                         else ChatTemplateFormatter(loaded.chat_template))
            result = evaluate_instruction_examples(
                loaded.model, loaded.tokenizer, examples, arguments.context,
                arguments.batch_size, formatter=formatter, response_only=arguments.response_only,
            )
    if arguments.json:
        import dataclasses

        print(json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True))
    else:
        _say(f"evaluate: loss {result.loss:.4f} nats/token, perplexity {result.perplexity:.2f} "
             f"over {result.target_token_count:,} targets ({result.chunk_count} chunks, "
             f"{result.usable_example_count} sequences, {result.skipped_example_count} skipped) "
             f"in {result.elapsed_seconds:.2f} s")
    return 0


def command_generate(arguments) -> int:
    from .serving import GenerationConfig

    prompt = arguments.prompt
    with _open_model(arguments) as loaded:
        stop: tuple[str, ...] = ()
        if arguments.chat:
            prompt = loaded.encode_chat([{"role": "user", "content": prompt}])
            stop = tuple(loaded.chat_template.stop_sequences)
        config = GenerationConfig(
            max_new_tokens=arguments.max_new_tokens, stop=stop,
            end_token_id=loaded.end_token_id, **_sampling_options(arguments),
        )
        if not arguments.chat:
            sys.stdout.write(prompt)
        timer = _GenerationTimer()
        result = loaded.generator.generate(prompt, config, on_token=timer.on_token)
        sys.stdout.write("\n")
    sys.stderr.write(f"generate: {timer.summary(result)}\n")
    return 0


def _add_sampling(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=_non_negative_float, default=0.0,
                        help="0 is greedy decoding")
    parser.add_argument("--top-k", type=_positive_int, default=None,
                        help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=_fraction_or_zero, default=None,
                        help="sample among the most likely tokens whose probabilities sum to p")
    parser.add_argument("--min-p", type=_fraction_or_zero, default=None,
                        help="drop tokens less likely than min-p times the most likely one")
    parser.add_argument("--repetition-penalty", type=_positive_float, default=1.0,
                        help="divide the logits of tokens already seen (1: off)")
    parser.add_argument("--seed", type=_non_negative_int, default=0)


def _sampling_options(arguments) -> dict:
    return {"temperature": arguments.temperature, "top_k": arguments.top_k,
            "top_p": arguments.top_p, "min_p": arguments.min_p,
            "repetition_penalty": arguments.repetition_penalty, "seed": arguments.seed}


class _GenerationTimer:
    """Streams tokens to stdout and times them, as llama.cpp reports: the prompt's processing
    (up to the first generated token) and the decode of the tokens after it."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None

    def on_token(self, event) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        sys.stdout.write(event.text)
        sys.stdout.flush()

    def summary(self, result) -> str:
        ended = time.perf_counter()
        prompt_count = len(result.prompt_token_ids)
        generated = len(result.generated_token_ids)
        parts = []
        first = self.first if self.first is not None else ended
        prefill = first - self.started
        parts.append(f"prompt {prompt_count} tokens in {prefill * 1000:.1f} ms"
                     + (f" ({prompt_count / prefill:.1f} tokens/s)" if prefill > 0 else ""))
        decode = ended - first
        if generated > 1 and decode > 0:
            parts.append(f"{generated} tokens generated, {generated - 1} after the first in "
                         f"{decode * 1000:.1f} ms ({(generated - 1) / decode:.1f} tokens/s)")
        else:
            parts.append(f"{generated} tokens generated")
        return "; ".join(parts) + f"; finish reason {result.finish_reason}"


def command_chat(arguments) -> int:
    from .serving import GenerationConfig

    with _open_model(arguments, maximum_context=arguments.maximum_context) as loaded:
        interactive = sys.stdin.isatty()
        _say(f"chat: {loaded.architecture} model from {arguments.model} "
             f"({loaded.chat_template!r}); /reset starts over, /exit quits")
        history = []
        if arguments.system is not None:
            history.append({"role": "system", "content": arguments.system})
        base = list(history)
        while True:
            if interactive:
                sys.stdout.write("you> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            if text.strip() == "/exit":
                break
            if text.strip() == "/reset":
                history = list(base)
                _say("chat: conversation reset")
                continue
            if not text.strip():
                continue
            history.append({"role": "user", "content": text})
            prompt = loaded.encode_chat(history)
            config = GenerationConfig(
                max_new_tokens=arguments.max_new_tokens,
                stop=tuple(loaded.chat_template.stop_sequences),
                end_token_id=loaded.end_token_id, **_sampling_options(arguments),
            )
            sys.stdout.write("assistant> ")
            sys.stdout.flush()
            timer = _GenerationTimer()
            result = loaded.generator.generate(prompt, config, on_token=timer.on_token)
            sys.stdout.write("\n")
            sys.stdout.flush()
            sys.stderr.write(f"chat: {timer.summary(result)}\n")
            history.append({"role": "assistant", "content": result.generated_text.strip()})
    return 0


def command_serve(arguments) -> int:
    from .serving import ModelService, ServingConfig, serve

    source = arguments.bundle if arguments.bundle is not None else arguments.model
    config = ServingConfig(
        host=arguments.host, port=arguments.port, allow_remote=arguments.allow_remote,
        maximum_new_tokens=arguments.max_new_tokens, kv_cache=arguments.kv_cache,
        model_name=source.stem, max_connections=arguments.max_connections,
        api_key=arguments.api_key or os.environ.get("RIFTCO_API_KEY") or None,
    )
    with _open_model(arguments) as loaded, \
            ModelService(loaded.model, loaded.tokenizer, config,
                         chat_template=loaded.chat_template) as service:
        def ready(server) -> None:
            _say(f"serve: {source.name} ({loaded.architecture}) at {server.url}/ "
                 f"({service.engine.kind} engine); Ctrl-C stops")

        serve(service, max_requests=arguments.max_requests, ready=ready)
    _say("serve: stopped")
    return 0


def _rope_scaling_text(config) -> str:
    """A rotary config's RoPE scaling for `inspect`: the kind and the fields it reads."""
    if config.rope_scaling == "frequency_factors":  # a GGUF file's rope_freqs.weight
        factors = ", ".join(f"{factor:g}" for factor in config.rope_frequency_factors)
        return f"theta={config.rope_theta:g} frequency_factors=[{factors}]"
    text = (f"theta={config.rope_theta:g} {config.rope_scaling} "
            f"factor={config.rope_scaling_factor:g}")
    if config.rope_scaling == "llama3":
        text += (f" low={config.rope_low_frequency_factor:g}"
                 f" high={config.rope_high_frequency_factor:g}"
                 f" original_context={config.rope_original_context}")
    elif config.rope_scaling == "yarn":
        attention = config.rope_yarn_attention_factor
        text += (f" original_context={config.rope_original_context}"
                 f" beta_fast={config.rope_yarn_beta_fast:g}"
                 f" beta_slow={config.rope_yarn_beta_slow:g}"
                 f" attention_factor={f'{attention:g}' if attention else '0.1*ln(factor)+1'}")
    return text


def _decoder_layout_text(config) -> str:
    """The general decoder's GPT-2 choices (C ABI 2.12) that are not Llama's; empty if none."""
    parts = []
    if config.positions != "rotary":
        parts.append(f"positions={config.positions}")
    if config.norm != "rms":
        parts.append(f"norm={config.norm}")
    if config.feed_forward != "gated":
        parts.append(f"feed_forward={config.feed_forward}({config.plain_activation})")
    biases = [name for name, present in (
        ("qkv", config.query_key_value_bias), ("output", config.output_bias),
        ("feed_forward", config.feed_forward_bias),
        ("head", config.head_bias and not config.tie_embeddings)) if present]
    if biases and (config.output_bias or config.feed_forward_bias or config.head_bias):
        parts.append("biases=" + ",".join(biases))
    return " ".join(parts)


def _inspect_gguf(path: Path) -> None:
    """A GGUF file's summary from its metadata strings (no tensor is read)."""
    from .native.pretrained_tokenizer import gguf_metadata_string

    def value(key: str) -> str:
        found = gguf_metadata_string(path, key)
        return "(absent)" if found is None else found

    template = gguf_metadata_string(path, "tokenizer.chat_template")
    _say(f"gguf {path}\n  architecture {value('general.architecture')}\n"
         f"  name         {value('general.name')}\n"
         f"  tokenizer    {value('tokenizer.ggml.model')} (pre-tokenizer "
         f"{value('tokenizer.ggml.pre')})\n"
         f"  chat         {'a chat template' if template else 'no chat template'}\n"
         f"  size         {path.stat().st_size:,} bytes\n"
         f"  (riftco chat/generate --model {path.name} runs it; riftco post-train --model tunes "
         "it)")


def _inspect_huggingface(path: Path) -> None:
    """A Hugging Face directory's summary: its config as our importer reads it, its tensors
    (headers only) and its tokenizer files."""
    from collections import Counter

    from .interchange.huggingface import read_checkpoint_tensors, read_config

    config = read_config(path)
    tensors = read_checkpoint_tensors(path)
    dtypes = Counter(span.dtype for span in tensors.values())
    values = sum(math.prod(span.shape) for span in tensors.values())
    files = [name for name in ("tokenizer.json", "tokenizer_config.json",
                               "generation_config.json") if (path / name).is_file()]
    architecture = getattr(config, "architecture", "gpt2")
    _say(f"huggingface {path}\n  architecture {architecture}\n"
         f"  model        V={config.vocabulary_size} C={config.maximum_context} "
         f"D={config.model_width} N={config.block_count} F={config.feed_forward_width}\n"
         f"  tensors      {len(tensors)} ({', '.join(f'{n} {d}' for d, n in dtypes.items())}), "
         f"{values:,} values\n"
         f"  files        {', '.join(files) if files else 'no tokenizer files'}")
    layout = _decoder_layout_text(config) if hasattr(config, "positions") else ""
    if layout:
        _say(f"  layout       {layout}")


def _inspect_peft(path: Path) -> None:
    """A PEFT adapter directory's summary: its config as read and checked, its tensors
    (headers only) and the base it records."""
    from collections import Counter

    from .interchange.peft import read_peft_adapter

    adapter = read_peft_adapter(path)
    spans = adapter.tensors.values()
    dtypes = Counter(span.dtype for span in spans)
    targets = adapter.target_modules
    order = list(targets) if not isinstance(targets, str) else []
    kinds = Counter(sorted((module.rsplit(".", 1)[-1] for module in adapter.modules),
                           key=lambda kind: (order.index(kind) if kind in order else len(order),
                                             kind)))
    rank, alpha = adapter.rank, adapter.alpha
    scaling = alpha / (math.sqrt(rank) if adapter.rank_stabilized else rank)
    rule = "alpha/sqrt(r), rsLoRA" if adapter.rank_stabilized else "alpha/r"
    _say(f"peft adapter {path}\n  type         LoRA r={rank} alpha={alpha:g} scaling={scaling:g} "
         f"({rule})\n"
         f"  targets      {targets if isinstance(targets, str) else ', '.join(targets)}\n"
         f"  modules      {len(adapter.modules)} ("
         + ", ".join(f"{count} {kind}" for kind, count in kinds.items()) + ")\n"
         f"  tensors      {len(adapter.tensors)} ("
         + ", ".join(f"{count} {dtype}" for dtype, count in dtypes.items())
         + f"), {sum(math.prod(span.shape) for span in spans):,} values, "
         f"{sum(span.end - span.begin for span in spans):,} bytes\n"
         f"  base         {adapter.base_model_name_or_path or '(not named)'}")
    recorded = ", ".join(f"{key} {value}" for key, value in adapter.base.items())
    _say(f"  base check   {recorded or 'none recorded (checked against a base by shape only)'}")


def command_inspect(arguments) -> int:
    if arguments.path.is_dir():
        if arguments.json:
            raise UsageError("--json prints a bundle's or checkpoint's manifest")
        from .interchange.peft import ADAPTER_CONFIG_FILE

        if (arguments.path / ADAPTER_CONFIG_FILE).is_file():
            _inspect_peft(arguments.path)
        else:
            _inspect_huggingface(arguments.path)
        return 0
    with open(arguments.path, "rb") as stream:
        if stream.read(4) == b"GGUF":
            if arguments.json:
                raise UsageError("--json prints a bundle's or checkpoint's manifest")
            _inspect_gguf(arguments.path)
            return 0
    from .checkpoints import read_artifact

    kind, loaded = read_artifact(arguments.path)
    if kind == "rift":
        bundle = loaded
        if arguments.json:
            print(json.dumps(bundle.manifest, indent=2, sort_keys=True))
            return 0
        config = bundle.config
        tokenizer = bundle.tokenizer_state
        if hasattr(config, "query_head_count"):  # the rotary decoder's families
            heads = (f"{config.architecture} Hq={config.query_head_count} "
                     f"Hkv={config.key_value_head_count} d={config.resolved_head_width}")
        else:
            heads = f"gpt H={config.head_count}"
        _say(f"bundle {arguments.path}\n  artifact_id  {bundle.artifact_id}\n"
             f"  stage        {bundle.stage}\n  parent       {bundle.parent_artifact_id}\n"
             f"  model        {heads} V={config.vocabulary_size} C={config.maximum_context} "
             f"D={config.model_width} N={config.block_count} "
             f"F={config.feed_forward_width} seed={config.random_seed}\n"
             f"  parameters   {bundle.weight_count:,} floats in {len(bundle.parameters)} tensors\n"
             f"  tokenizer    {tokenizer['method']}, {config.vocabulary_size} tokens")
        if hasattr(config, "rope_scaling") and config.rope_scaling != "none":
            _say(f"  rope         {_rope_scaling_text(config)}")
        layout = _decoder_layout_text(config) if hasattr(config, "positions") else ""
        if layout:
            _say(f"  layout       {layout}")
        for key, value in sorted(bundle.metadata.items()):
            if not isinstance(value, (dict, list)):
                _say(f"  metadata.{key} = {value}")
        return 0
    if kind == "riftckpt":
        checkpoint = loaded
        manifest = checkpoint.manifest
        if arguments.json:
            print(json.dumps(manifest, indent=2, sort_keys=True))
            return 0
        model = manifest["model"]
        optimizer = manifest["optimizer"]
        source = manifest["batch_source"]
        _say(f"checkpoint {arguments.path}\n  checkpoint_id {checkpoint.checkpoint_id}\n"
             f"  global_step   {checkpoint.global_step}\n"
             f"  model         {model['config']} quantized={model['quantized']} "
             f"lora={model['lora']}\n"
             f"  optimizer     adam scope={optimizer['scope']} {optimizer['options']}\n"
             f"  batch source  {None if source is None else source['type']} "
             f"(batches emitted: {None if source is None else source['batches_emitted']})\n"
             f"  members       "
             + ", ".join(f"{m['name']} ({m['bytes']:,} B)" for m in manifest["members"]))
        return 0
    tensors, metadata = loaded
    _say(f"safetensors {arguments.path}: {len(tensors)} F32 tensors, "
         f"{sum(len(t.values) for t in tensors.values()):,} floats; metadata keys "
         f"{sorted(metadata)}")
    return 0


CONVERT_DESTINATION_FORMATS = ("rift", "safetensors", "gguf", "hf", "peft")
_CONVERT_EXTENSIONS = {".rift": "rift", ".safetensors": "safetensors", ".gguf": "gguf"}
_DIRECTORY_FORMATS = ("hf", "peft")


def _require_directory_name(path: Path, what: str) -> None:
    """A directory destination may hold dots in its name, but not end in a file format's
    extension (never a directory under a file's name)."""
    suffix = path.suffix.lower()
    if suffix in _CONVERT_EXTENSIONS or suffix == ".riftckpt":
        raise UsageError(f"{what} writes a directory, not a {suffix} file ({path.name!r})")


def _convert_destination_format(arguments) -> str:
    """The destination's format: ``--to``, else its extension; a name whose extension says
    another format, or none of the three, is a usage error (never a file under a wrong
    name)."""
    suffix = arguments.destination.suffix.lower()
    named = _CONVERT_EXTENSIONS.get(suffix)
    chosen = arguments.destination_format
    if chosen in _DIRECTORY_FORMATS:  # its name may hold dots, not a file format's extension
        _require_directory_name(arguments.destination, f"--to {chosen}")
        return chosen
    if chosen is None:
        if named is None:
            raise UsageError(f"cannot tell the destination format from the name "
                             f"{arguments.destination.name!r}: end it in "
                             f"{', '.join(_CONVERT_EXTENSIONS)} or give --to")
        return named
    if named is not None and named != chosen:
        raise UsageError(f"--to {chosen} would write {chosen} under the {suffix} name "
                         f"{arguments.destination.name!r}")
    return chosen


def command_convert(arguments) -> int:
    from .artifacts import ModelBundle
    from .interchange import export_bundle_safetensors, export_gguf, import_bundle_safetensors

    destination_format = _convert_destination_format(arguments)
    if arguments.base_model is not None and destination_format != "peft":
        raise UsageError(f"--base-model is for PEFT adapter destinations (--to peft; this one "
                         f"is {destination_format})")
    if destination_format == "peft":
        return _export_peft(arguments)
    if arguments.dtype is not None and destination_format not in ("gguf", "hf"):
        raise UsageError(f"--dtype {arguments.dtype} is for GGUF and Hugging Face destinations "
                         f"(this one is {destination_format})")
    if arguments.dtype == "bf16" and destination_format == "gguf":
        raise UsageError("--dtype bf16 is for Hugging Face directories; GGUF takes f32, f16, "
                         "q8_0 or q4_0")
    if arguments.dtype in ("q8_0", "q4_0") and destination_format == "hf":
        raise UsageError(f"--dtype {arguments.dtype} is for GGUF files; a Hugging Face "
                         "directory takes f32, f16 or bf16")
    source_format = arguments.source_format
    if source_format is None:  # a bundle is a ZIP; the loader below validates it in full
        with open(arguments.source, "rb") as stream:
            head = stream.read(4)
        if head == b"GGUF":
            raise UsageError(f"{arguments.source} is a GGUF file: convert reads .rift bundles "
                             "and safetensors files (riftco chat/generate --model read GGUF)")
        source_format = "rift" if head == b"PK\x03\x04" else "safetensors"
    if source_format == destination_format:
        raise UsageError(f"the source and the destination are both {source_format}")
    if source_format == "rift":
        bundle = ModelBundle.load(arguments.source)
    else:
        bundle = import_bundle_safetensors(arguments.source)
    if destination_format == "gguf":
        export_gguf(bundle, arguments.destination, dtype=arguments.dtype or "f32")
        _say_gguf_fallbacks(bundle, arguments.dtype or "f32")
    elif destination_format == "hf":
        from .interchange import export_huggingface

        export_huggingface(bundle, arguments.destination, dtype=arguments.dtype or "f32")
    elif destination_format == "safetensors":
        export_bundle_safetensors(bundle, arguments.destination)
    else:
        bundle.save(arguments.destination)
    _say(f"convert: {arguments.source} ({source_format}) -> {arguments.destination} "
         f"({destination_format}), artifact {bundle.artifact_id[:16]}")
    return 0


def _say_gguf_fallbacks(bundle, dtype: str) -> None:
    """The matrices a q8_0/q4_0 GGUF export wrote in F16 (rows not a multiple of 32)."""
    if dtype not in ("q8_0", "q4_0"):
        return
    from .interchange.gguf_export import gguf_tensor_types

    fallback = [name for name, kind in gguf_tensor_types(bundle, dtype).items() if kind == "F16"]
    if fallback:
        shown = ", ".join(fallback[:3]) + (f" and {len(fallback) - 3} more"
                                           if len(fallback) > 3 else "")
        _say(f"convert: {len(fallback)} matrices whose rows are not a multiple of 32 values are "
             f"F16, not {dtype.upper()}, as llama.cpp's converter writes them: {shown}")


def _export_peft(arguments) -> int:
    """convert/export --to peft: a LoRA/QLoRA run's checkpoint as a PEFT adapter directory."""
    from .interchange import export_peft

    if arguments.dtype is not None:
        raise UsageError("--dtype is for GGUF and Hugging Face destinations; a PEFT adapter "
                         "is written in F32")
    if arguments.source_format is not None:
        raise UsageError("--from is for bundle and safetensors sources; --to peft reads the "
                         ".riftckpt checkpoint of a LoRA or QLoRA run")
    export_peft(arguments.source, arguments.destination,
                base_model_name_or_path=arguments.base_model)
    _say(f"convert: {arguments.source} (LoRA checkpoint) -> {arguments.destination} (PEFT "
         "adapter)")
    return 0


def demo_data_path(name: str) -> Path:
    """A bundled demo file: the wheel's copy, or the source checkout's ``data/``."""
    package = Path(__file__).resolve().parent
    candidates = {
        "corpus": [package / "demo_data" / "alice_in_wonderland.txt",
                   package.parent.parent / "data" / "corpus" / "alice_in_wonderland.txt"],
        "instructions": [package / "demo_data" / "tiny_instructions.jsonl",
                         package.parent.parent / "data" / "instructions"
                         / "tiny_instructions.jsonl"],
    }[name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the bundled {name} file is missing (looked in "
                            f"{[str(c) for c in candidates]})")


# The demo's post-training epochs (measured: its held-out response loss still improves at the
# eighth; see command_demo).
DEMO_EPOCHS = 8


def command_demo(arguments) -> int:
    from .evaluation import evaluate_instruction_examples
    from .instructions import read_instructions_jsonl
    from .post_training import PostTrainingConfig, post_train, scaled_defaults
    from .pretraining import PretrainingConfig, pretrain_file
    from .serving import GenerationConfig, PlainChatTemplate, TextGenerator

    started = time.perf_counter()
    output = arguments.output_dir or Path(tempfile.mkdtemp(prefix="riftco-demo-"))
    output.mkdir(parents=True, exist_ok=True)
    corpus = demo_data_path("corpus")
    examples = read_instructions_jsonl(demo_data_path("instructions"))
    # Every seventh example is held out (the file mixes kinds of questions; a tail would be
    # one kind only).
    held_out = tuple(example for index, example in enumerate(examples) if index % 7 == 3)
    train_examples = tuple(example for index, example in enumerate(examples) if index % 7 != 3)
    _say(f"demo: 1/4 pretraining a GPT on {corpus.name} ({corpus.stat().st_size:,} bytes), "
         f"{arguments.steps} steps")
    config = PretrainingConfig(
        steps=arguments.steps, context_size=64, batch_size=16, vocabulary_size=512,
        model_width=128, head_count=4, block_count=2, feed_forward_width=512,
        learning_rate=3e-3, evaluation_interval=50, backend=arguments.backend, attention="flash",
    )
    phase = time.perf_counter()
    pretrained = pretrain_file(corpus, config)
    base_path = output / "pretrained.rift"
    pretrained.bundle.save(base_path)
    validation = [m for m in pretrained.metrics if m.phase == "validation"]
    _say(f"demo:   held-out loss {validation[0].loss:.3f} -> {validation[-1].loss:.3f} nats/token "
         f"in {time.perf_counter() - phase:.1f} s; wrote {base_path}")

    phase = time.perf_counter()
    # Whole examples, one per row: the context is the model's (64 tokens), longer ones are
    # truncated. The steps follow post-train's rule (epochs over the examples, a 5% warmup, a
    # cosine decay), at the rate this small model needs: it was pretrained from scratch at
    # 3e-3, and the full fine-tuning default (2e-5, for pretrained LLMs) barely moves it
    # (held-out response loss 4.894 -> 4.838 in 3 epochs), where 1e-3 for 8 epochs improves
    # at every validation, 4.894 -> 3.905; 3e-3 over-fits after 3 epochs. Early stopping
    # guards a longer --post-train-steps.
    schedule = scaled_defaults("full", len(train_examples), 8, steps=arguments.post_train_steps,
                               epochs=None if arguments.post_train_steps else DEMO_EPOCHS,
                               learning_rate=1e-3, lr_schedule="cosine")
    _say(f"demo: 2/4 post-training (full, response-only loss) on {len(train_examples)} "
         f"instruction examples, whole examples: {schedule.describe()}")
    tuned = post_train(
        pretrained.bundle, train_examples,
        PostTrainingConfig(steps=schedule.steps, batch_size=8,
                           learning_rate=schedule.learning_rate, backend=arguments.backend,
                           response_only_loss=True, lr_schedule="cosine",
                           warmup_steps=schedule.warmup_steps,
                           minimum_learning_rate_fraction=0.1, evaluation_interval=5,
                           early_stopping_patience=3),
        validation_examples=held_out,
    )
    tuned_path = output / "post_trained.rift"
    tuned.bundle.save(tuned_path)
    trained = [metric for metric in tuned.metrics if metric.phase == "train"]
    stopping = (f"; stopped early after step {trained[-1].step}, kept step {tuned.best_step}"
                if tuned.stopped_early else f"; kept step {tuned.best_step}")
    _say(f"demo:   training loss {trained[0].loss:.3f} -> {trained[-1].loss:.3f} in "
         f"{time.perf_counter() - phase:.1f} s{stopping}; wrote {tuned_path} (parent "
         f"{tuned.bundle.parent_artifact_id[:12]})")

    _say(f"demo: 3/4 evaluating on {len(held_out)} held-out examples (responses only)")
    with pretrained.bundle.instantiate() as base_runtime, tuned.bundle.instantiate() as runtime:
        base_score = evaluate_instruction_examples(base_runtime.model, base_runtime.tokenizer,
                                                   held_out, None, 8, response_only=True)
        tuned_score = evaluate_instruction_examples(runtime.model, runtime.tokenizer, held_out,
                                                    None, 8, response_only=True)
        _say(f"demo:   response loss {base_score.loss:.3f} (pretrained) -> {tuned_score.loss:.3f} "
             f"(post-trained), delta {tuned_score.loss - base_score.loss:+.3f} over "
             f"{tuned_score.target_token_count} tokens")
        _say("demo: 4/4 generating (greedy, KV-cached)")
        template = PlainChatTemplate()
        generator = TextGenerator(runtime.model, runtime.tokenizer)
        for example in (train_examples[0], held_out[0]):
            question = (example.prompt if hasattr(example, "prompt")
                        else example.messages[-2].content)
            result = generator.generate(
                template.render([{"role": "user", "content": question}]),
                # The demo's answers are one line: stop at its end, or at the next turn.
                GenerationConfig(max_new_tokens=32, stop=("\n", *template.stop_sequences)),
            )
            _say(f"demo:   Q: {question}\ndemo:   A: {result.generated_text.strip()}")
    _say(f"demo: done in {time.perf_counter() - started:.1f} s; bundles in {output}")
    return 0


def command_launch(arguments) -> int:
    from .launch import launch

    command = list(arguments.launched)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("give the command to run after --, e.g. riftco launch -n 2 -- riftco "
                         "pretrain ... --data-parallel")
    result = launch(command, arguments.ranks, arguments.max_restarts, arguments.mpirun,
                    arguments.mpirun_arguments)
    if result.status == 0 and result.failures:
        _say(f"riftco launch: finished after {len(result.failures)} restart"
             f"{'s' if len(result.failures) > 1 else ''}")
    return result.status


COMMANDS = {
    "launch": command_launch,
    "pretrain": command_pretrain,
    "post-train": command_post_train,
    "evaluate": command_evaluate,
    "generate": command_generate,
    "serve": command_serve,
    "chat": command_chat,
    "inspect": command_inspect,
    "convert": command_convert,
    "export": command_convert,
    "demo": command_demo,
}


def main(argv: list[str] | None = None) -> int:
    from .native import RiftcoTransformerError

    parser = build_parser()
    arguments = parser.parse_args(argv)
    prog = f"riftco {arguments.command}"
    try:
        return COMMANDS[arguments.command](arguments)
    except UsageError as error:
        sys.stderr.write(f"{prog}: error: {error} (see {prog} --help)\n")
    except KeyboardInterrupt as interrupt:
        from .training import TrainingInterrupted

        if isinstance(interrupt, TrainingInterrupted):
            sys.stderr.write(f"{prog}: interrupted after step {interrupt.step}; checkpoint "
                             f"{interrupt.checkpoint} saved (continue with --resume "
                             f"{interrupt.checkpoint})\n")
            return 128 + interrupt.signal_number  # 130 for SIGINT, 143 for SIGTERM
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except (ValueError, TypeError, OSError, RiftcoTransformerError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        if (isinstance(error, OSError) and error.filename is not None
                and str(error.filename) not in message):
            message = f"{error.filename}: {message}"
        sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
