"""Helpers shared by the test modules (imported as ``support``; pytest puts this directory on
``sys.path``)."""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

from riftco_transformer import RiftcoTransformerError

# An interpreter with third-party reference implementations (e.g. safetensors, numpy) that the
# suite's own interpreter need not have; tests that compare against one skip without it.
ORACLE_PYTHON_VARIABLE = "RIFTCO_TRANSFORMER_ORACLE_PYTHON"


def native_error(call) -> RiftcoTransformerError:
    """The RiftcoTransformerError that ``call()`` raises (the test fails if it raises none)."""
    with pytest.raises(RiftcoTransformerError) as caught:
        call()
    return caught.value


def oracle_python(module: str) -> str:
    """The interpreter named by ``$RIFTCO_TRANSFORMER_ORACLE_PYTHON``, checked to import
    ``module``; skips the calling test when the variable is unset or that interpreter cannot
    import it."""
    python = os.environ.get(ORACLE_PYTHON_VARIABLE)
    if not python:
        pytest.skip(f"{ORACLE_PYTHON_VARIABLE} is not set (an interpreter with {module})")
    problem = _oracle_import_problem(python, module)
    if problem is not None:
        pytest.skip(problem)
    return python


@functools.lru_cache(maxsize=None)
def _oracle_import_problem(python: str, module: str) -> str | None:
    """Why ``python`` cannot import ``module``, or None when it can (asked once per pair)."""
    try:
        completed = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"{ORACLE_PYTHON_VARIABLE}={python!r} cannot run: {error}"
    if completed.returncode != 0:
        reason = (completed.stderr.strip().splitlines() or ["no message"])[-1]
        return f"{ORACLE_PYTHON_VARIABLE}={python!r} cannot import {module}: {reason}"
    return None
