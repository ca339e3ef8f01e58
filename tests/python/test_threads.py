"""Closing a wrapper while other threads use it: no crash, only success or "<Class> is closed"."""

from __future__ import annotations

import threading
import time

from riftco_transformer import (
    Adam,
    Context,
    DecoderOnlyTransformer,
    Tensor,
    Tokenizer,
    cross_entropy,
)

TOKENS = [[1, 2, 3, 4, 5, 6, 7, 8]] * 4
TARGETS = [[2, 3, 4, 5, 6, 7, 8, 9]] * 4
JOIN_TIMEOUT_SECONDS = 60
CALLS_BEFORE_CLOSE = 16


def hammer(works, close, closed_message: str, *, iterations: int = 10_000):
    """Run each of ``works`` (one callable per thread) up to ``iterations`` times on its own
    thread while one more thread calls ``close()`` as soon as a few calls have completed.

    Returns every exception other than ``RuntimeError(closed_message)``. A worker stops at
    its first "closed" error. Fails if the close did not happen while calls were in flight.
    """
    start = threading.Barrier(len(works) + 1)
    lock = threading.Lock()
    completed = [0]
    unexpected: list[BaseException] = []

    def worker(work) -> None:
        start.wait()
        for _ in range(iterations):
            try:
                work()
            except RuntimeError as error:
                if str(error) != closed_message:
                    with lock:
                        unexpected.append(error)
                return
            except BaseException as error:  # noqa: BLE001 (any other failure is a finding)
                with lock:
                    unexpected.append(error)
                return
            with lock:
                completed[0] += 1

    def closer() -> None:
        start.wait()
        while completed[0] < CALLS_BEFORE_CLOSE:
            time.sleep(0.001)
        close()

    threads = [threading.Thread(target=worker, args=(work,)) for work in works]
    threads.append(threading.Thread(target=closer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_SECONDS)
    assert not any(thread.is_alive() for thread in threads), "a thread hung (deadlock?)"
    assert completed[0] < len(works) * iterations, "every call finished before the close"
    return unexpected


def test_closing_a_model_while_threads_run_forwards_losses_and_steps(tiny_config):
    model = DecoderOnlyTransformer(tiny_config)
    optimizer = Adam(model.parameters())
    steps = [0]

    def evaluate() -> None:
        with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
            assert loss.item() > 0
            assert logits.shape == (4, 8, tiny_config.vocabulary_size)
        with model.parameters() as parameters:
            assert len(parameters.flat_values()) == parameters.total_numel

    def train() -> None:
        # The only thread that steps, so no other step can make its graph stale.
        with model(TOKENS) as logits, cross_entropy(logits, TARGETS) as loss:
            loss.backward()
        optimizer.step()
        steps[0] += 1

    unexpected = hammer([evaluate] * 7 + [train], model.close, "DecoderOnlyTransformer is closed")
    assert unexpected == []
    assert model.closed
    assert optimizer.step_count == steps[0]  # the optimizer outlives the model wrapper
    optimizer.close()


def test_closing_a_shared_variable_while_threads_read_it(model):
    logits = model(TOKENS)
    unexpected = hammer(
        [lambda: logits.to_array() and logits.shape] * 8, logits.close, "Variable is closed"
    )
    assert unexpected == []
    assert model.to("cpu") is model  # the released variable no longer pins the model


def test_closing_a_tokenizer_while_threads_encode_and_decode():
    tokenizer = Tokenizer("the quick brown fox " * 50, method="bpe", vocabulary_size=300)
    text = "the quick brown fox jumps"

    def work() -> None:
        assert tokenizer.decode(tokenizer.encode(text)) == text

    unexpected = hammer([work] * 8, tokenizer.close, "Tokenizer is closed")
    assert unexpected == []


def test_closing_a_tensor_while_threads_multiply_it_both_ways():
    with Context() as context:
        left = Tensor.from_data(context, (16, 16), [1.0] * 256)
        right = Tensor.from_data(context, (16, 16), [2.0] * 256)

    def work() -> None:
        # Opposite operand orders take the two tensors' locks; a fixed lock order avoids
        # the deadlock that taking them in argument order would allow.
        with left @ right as product, right @ left as reverse:
            assert product.tolist() == reverse.tolist() == [32.0] * 256

    unexpected = hammer([work] * 8, left.close, "Tensor is closed")
    assert unexpected == []
    right.close()
