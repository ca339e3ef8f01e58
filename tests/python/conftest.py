"""Shared fixtures of the Python suite.

The suite finds the native library through the package's normal loader: run it with
``RIFTCO_TRANSFORMER_LIBRARY=<built library>`` (or from a checkout with a release build) and
``PYTHONPATH=python``; this file adds ``<repo>/python`` to ``sys.path`` when needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
PYTHON_SOURCE = REPOSITORY / "python"
if str(PYTHON_SOURCE) not in sys.path:
    sys.path.insert(0, str(PYTHON_SOURCE))

from riftco_transformer import (  # noqa: E402 (needs the path above)
    Context,
    DecoderOnlyTransformer,
    TransformerConfig,
)

# A model small enough that a forward, backward and Adam step take about a millisecond.
TINY_CONFIG = TransformerConfig(
    vocabulary_size=32,
    maximum_context=8,
    model_width=16,
    head_count=4,
    block_count=1,
    feed_forward_width=32,
    random_seed=7,
)


@pytest.fixture
def tiny_config() -> TransformerConfig:
    return TINY_CONFIG


@pytest.fixture
def model():
    with DecoderOnlyTransformer(TINY_CONFIG) as created:
        yield created


@pytest.fixture
def context():
    with Context("cpu") as created:
        yield created


def python_environment(**overrides: str | None) -> dict[str, str]:
    """This process's environment with the package importable, plus ``overrides``.

    An override of None removes the variable.
    """
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHON_SOURCE), *filter(None, [environment.get("PYTHONPATH")])]
    )
    for name, value in overrides.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment


@pytest.fixture
def run_python():
    """Run Python code (``-c``) or a script in a fresh interpreter; returns the completed process.

    The child sees this environment (so the same library) plus ``environment_overrides``.
    """

    def run(
        code: str | None = None,
        *,
        script: Path | None = None,
        arguments: tuple[str, ...] = (),
        environment_overrides: dict[str, str | None] | None = None,
        cwd: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        command = (
            [sys.executable, str(script)] if script is not None else [sys.executable, "-c", code]
        )
        return subprocess.run(
            [*command, *arguments],
            capture_output=True,
            text=True,
            env=python_environment(**(environment_overrides or {})),
            cwd=cwd,
            timeout=timeout,
        )

    return run
