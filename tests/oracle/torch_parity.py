#!/usr/bin/env python3
"""PyTorch parity for the reference tiny decoder (an independent oracle).

Runs tests/oracle/model_oracle_dump, loads its parameters into an equivalent PyTorch GPT
(learned positions, pre-norm blocks, exact-erf GELU, biased untied head), and compares logits,
loss and every parameter gradient (abs/rel 1e-4) for both attention kinds, then one Adam step
with global-norm clipping. Exits 77 (skipped) when PyTorch cannot be imported.

    torch_parity.py --dump-tool PATH [--work-dir DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except Exception as error:  # noqa: BLE001 - any import failure means "no oracle here"
    print(f"skipped: PyTorch is not importable ({error})")
    sys.exit(77)

ATOL = 1e-4
RTOL = 1e-4


def close(name, actual, expected, failures):
    actual = torch.as_tensor(actual, dtype=torch.float64).flatten()
    expected = torch.as_tensor(expected, dtype=torch.float64).flatten()
    if actual.shape != expected.shape:
        failures.append(f"{name}: {actual.numel()} values vs {expected.numel()}")
        return
    tolerance = ATOL + RTOL * torch.maximum(actual.abs(), expected.abs())
    difference = (actual - expected).abs()
    worst = int(torch.argmax(difference - tolerance))
    if bool((difference > tolerance).any()):
        failures.append(f"{name}: element {worst}: ours {actual[worst]:.9g} vs torch "
                        f"{expected[worst]:.9g}")


def torch_forward(p, dims, tokens, batch, time):
    d, h = dims["D"], dims["H"]
    head_width = d // h
    ids = torch.tensor(tokens).reshape(batch, time)
    x = p["token_embedding.weight"][ids] + p["position_embedding.weight"][torch.arange(time)]
    mask = torch.ones(time, time, dtype=torch.bool).tril()
    for i in range(dims["N"]):
        b = f"blocks.{i}."
        a = F.layer_norm(x, (d,), p[b + "attention_norm.scale"], p[b + "attention_norm.bias"], 1e-5)

        def heads(name):
            y = F.linear(a, p[b + f"attention.{name}.weight"], p[b + f"attention.{name}.bias"])
            return y.reshape(batch, time, h, head_width).permute(0, 2, 1, 3)

        q, k, v = heads("query"), heads("key"), heads("value")
        scores = q @ k.transpose(-1, -2) / (head_width ** 0.5)
        scores = scores.masked_fill(~mask, float("-inf"))
        context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(batch, time, d)
        x = x + F.linear(context, p[b + "attention.output.weight"], p[b + "attention.output.bias"])
        f = F.layer_norm(x, (d,), p[b + "feed_forward_norm.scale"], p[b + "feed_forward_norm.bias"], 1e-5)
        f = F.gelu(F.linear(f, p[b + "feed_forward.expand.weight"], p[b + "feed_forward.expand.bias"]))
        x = x + F.linear(f, p[b + "feed_forward.project.weight"], p[b + "feed_forward.project.bias"])
    x = F.layer_norm(x, (d,), p["final_norm.scale"], p["final_norm.bias"], 1e-5)
    return F.linear(x, p["language_model_head.weight"], p["language_model_head.bias"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump-tool", required=True)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="riftco_oracle_")
    dump_path = os.path.join(work, "oracle.json")
    subprocess.run([args.dump_tool, dump_path], check=True)
    with open(dump_path) as handle:
        dump = json.load(handle)

    torch.set_default_dtype(torch.float32)
    names = [entry["name"] for entry in dump["parameters"]]
    params = {
        entry["name"]: torch.tensor(entry["value"], dtype=torch.float32).reshape(entry["shape"]).requires_grad_()
        for entry in dump["parameters"]
    }
    batch, time = dump["batch"], dump["time"]
    logits = torch_forward(params, dump["dimensions"], dump["tokens"], batch, time)
    loss = F.cross_entropy(logits.reshape(-1, dump["dimensions"]["V"]), torch.tensor(dump["targets"]))
    loss.backward()

    failures = []
    for kind, run in dump["runs"].items():
        close(f"{kind} loss", [run["loss"]], [loss.item()], failures)
        close(f"{kind} logits", run["logits"], logits.detach(), failures)
        for name, gradient in zip(names, run["gradients"]):
            close(f"{kind} gradient {name}", gradient, params[name].grad, failures)

    # One Adam step: global-norm clipping at 1.0, then Adam(lr 1e-2, 0.9/0.999, eps 1e-8),
    # from OUR gradients (already compared above), so the step checks the optimizer alone:
    # parameters whose exact gradient is 0 (the key biases: softmax ignores a per-row shift)
    # carry rounding noise of either sign, and Adam's first step moves them by ±lr·sign(g).
    ordered = [params[name] for name in names]
    for name, gradient in zip(names, dump["runs"]["flash"]["gradients"]):
        params[name].grad = torch.tensor(gradient, dtype=torch.float32).reshape(params[name].shape)
    norm = torch.nn.utils.clip_grad_norm_(ordered, 1.0)
    close("gradient norm", [dump["adam"]["gradient_norm"]], [float(norm)], failures)
    optimizer = torch.optim.Adam(ordered, lr=dump["adam"]["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    optimizer.step()
    for name, value in zip(names, dump["adam"]["parameters"]):
        close(f"after Adam {name}", value, params[name].detach(), failures)

    if failures:
        print(f"{len(failures)} mismatches against PyTorch {torch.__version__}:")
        for failure in failures[:40]:
            print("  " + failure)
        return 1
    print(f"parity with PyTorch {torch.__version__}: loss {loss.item():.6f}; logits, "
          f"{len(names)} gradients (both attention kinds) and one Adam step within abs/rel {ATOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
