"""Modular addition with and without a program: train, ablate, trace.

Task: sequences ``a b =`` with a, b in [0, p); the model must predict ``(a + b) mod p`` at the
last position. Two models train on the same random half of the p² pairs and are scored on
the held-out half:

- learned-only: the ProgramAugmentedModel without a program;
- program-augmented: the same topology plus a program branch whose map is modular addition as
  a bilinear map on one-hot vectors, T[o, i, j] = 1 iff (i + j) mod p = o, fed from the two
  operand positions through learned projections and placed at the answer position.

Then the program's output is ablated (batch-rolled, so each example gets another's program
output) and the held-out accuracy is measured again, and one trace is captured to print the
projected program inputs of an example.

    PYTHONPATH=python python3 examples/python/programmed_modular_addition.py --modulus 7
"""

from __future__ import annotations

import argparse
import random

from riftco_transformer import Adam, cross_entropy_time_range
from riftco_transformer.programmed import (
    MultilinearMap,
    NeuralLoweringConfig,
    ProgramAugmentedForwardOptions,
    ProgramAugmentedModel,
    ProgramAugmentedModelConfig,
    ProgramBranch,
    ProgramInputLayout,
)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modulus", type=int, default=7)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--learning-rate", type=float, default=3e-2)
    parser.add_argument("--seed", type=int, default=3)
    return parser.parse_args()


def addition_map(p: int) -> MultilinearMap:
    indices = [((i + j) % p) * p * p + i * p + j for i in range(p) for j in range(p)]
    return MultilinearMap.from_sparse(p, (p, p), indices, [1.0] * len(indices))


def batch(pairs, p):
    """Tokens [N, 3]: a, b and the '=' token (id p)."""
    return [[a, b, p] for a, b in pairs]


def answer_accuracy(model, pairs, p, options=None) -> float:
    tokens = batch(pairs, p)
    logits, _ = model.forward(tokens, options)
    with logits:
        values = logits.tolist()
    vocabulary = p + 1
    correct = 0
    for n, (a, b) in enumerate(pairs):
        row = values[(n * 3 + 2) * vocabulary : (n * 3 + 3) * vocabulary]
        correct += max(range(vocabulary), key=row.__getitem__) == (a + b) % p
    return correct / len(pairs)


def train(model, pairs, p, steps, learning_rate) -> float:
    """Adam on the answer position only: cross_entropy_time_range scores time step 2 of every
    row (the other positions' targets are placeholders that do not count)."""
    tokens = batch(pairs, p)
    targets = []
    for a, b in pairs:
        targets += [0, 0, (a + b) % p]
    with model.parameters() as parameters, Adam(parameters, learning_rate=learning_rate) as adam:
        for _ in range(steps):
            logits, _ = model.forward(tokens)
            with logits, cross_entropy_time_range(logits, targets, 2, 1) as loss:
                value = loss.item()
                loss.backward()
            adam.step()
    return value


def main() -> None:
    arguments = parse_arguments()
    p = arguments.modulus
    generator = random.Random(arguments.seed)
    pairs = [(a, b) for a in range(p) for b in range(p)]
    generator.shuffle(pairs)
    training, held_out = pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]
    config = ProgramAugmentedModelConfig(
        vocabulary_size=p + 1, context_length=3, model_width=32, head_count=4,
        feed_forward_width=64, attention_branch_count=2, random_seed=arguments.seed,
    )
    with ProgramAugmentedModel(config) as learned:
        loss = train(learned, training, p, arguments.steps, arguments.learning_rate)
        learned_accuracy = answer_accuracy(learned, held_out, p)
    print(f"learned-only:      train loss {loss:.4f}, held-out answer accuracy {learned_accuracy:.3f}")

    with addition_map(p) as program_map:
        program = ProgramBranch(
            program_map,
            source_offset=0,
            source_length=2,
            target_offset=2,
            output_length=1,
            inputs=(ProgramInputLayout("source_position", 0, 0),
                    ProgramInputLayout("source_position", 1, 0)),  # one shared projection
            lowering=NeuralLoweringConfig(),  # auto: linear_attention, exact, frozen
            input_projection_bias=True,
        )
        model = ProgramAugmentedModel(config, program)
    with model:
        loss = train(model, training, p, arguments.steps, arguments.learning_rate)
        accuracy = answer_accuracy(model, held_out, p)
        ablated = answer_accuracy(
            model, held_out, p, ProgramAugmentedForwardOptions(ablate_program_output=True)
        )
        print(f"program-augmented: train loss {loss:.4f}, held-out answer accuracy {accuracy:.3f}")
        print(f"program output ablated (batch roll): held-out answer accuracy {ablated:.3f}")
        a, b = held_out[0]
        _, trace = model.forward(
            batch([(a, b)], p), ProgramAugmentedForwardOptions(capture_representations=True)
        )
        for index in (0, 1):
            projected = trace[f"program.input.{index}.projected"].values
            print(f"example {a} + {b}: projected program input {index} = "
                  + " ".join(f"{v:+.2f}" for v in projected))
        raw = trace["program.output.raw"].values
        print(f"example {a} + {b}: program output argmax {max(range(p), key=raw.__getitem__)} "
              f"(answer {(a + b) % p})")


if __name__ == "__main__":
    main()
