"""Library discovery and the ABI check.

Each test runs in a fresh interpreter: the library is loaded once per process, and these tests
must neither see nor disturb the copy this process already loaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from riftco_transformer.native._loader import library

PACKAGE_SOURCE = Path(__file__).resolve().parents[2] / "python" / "riftco_transformer"
LIBRARY_PATH = Path(library()._name).resolve()

PROBE = "from riftco_transformer.native import _loader; print(_loader.library()._name)"


def copy_package(destination: Path) -> Path:
    """A copy of the Python package under ``destination``; returns the package directory."""
    package = destination / "riftco_transformer"
    shutil.copytree(PACKAGE_SOURCE, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package


def fake_checkout(root: Path) -> Path:
    """A directory that looks like a source checkout, holding a copy of the package."""
    (root / "include" / "riftco_transformer").mkdir(parents=True)
    (root / "include" / "riftco_transformer" / "c_api.h").write_text("/* marker */\n")
    (root / "CMakeLists.txt").write_text("# marker\n")
    copy_package(root / "python")
    return root


def place_library(directory: Path, name: str = "libriftco_transformer_c.so") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(LIBRARY_PATH, directory / name))


def compile_stub_library(directory: Path, abi_version: int) -> Path:
    """A shared library exporting only ``rt_abi_version`` (skips without a C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to build a stub library")
    source = directory / "stub.c"
    source.write_text(f"unsigned int rt_abi_version(void) {{ return {abi_version:#x}u; }}\n")
    output = directory / "libstub.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(output), str(source)], check=True)
    return output


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux file names")


def test_importing_the_package_does_not_load_the_library(run_python, tmp_path):
    missing = tmp_path / "missing.so"
    result = run_python(
        "import riftco_transformer\n"
        "from riftco_transformer.native import _loader\n"
        "assert _loader._loaded_library is None\n"
        "print(riftco_transformer.TransformerConfig(8, 4, 8, 2, 1, 16).model_width)",
        environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": str(missing)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8"


def test_an_override_naming_a_missing_file_fails_without_fallback(run_python, tmp_path):
    missing = tmp_path / "nowhere" / "libriftco_transformer_c.so"
    result = run_python(
        "import riftco_transformer\n"
        "try:\n"
        "    riftco_transformer.backend_available('cpu')\n"
        "except OSError as error:\n"
        "    print(error)\n",
        environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": str(missing)},
    )
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert str(missing) in message
    assert "RIFTCO_TRANSFORMER_LIBRARY" in message
    # The override is the only candidate: the working release build is not tried.
    assert "build/release" not in message
    assert message.count("  - ") == 1


def test_a_library_without_rt_abi_version_is_rejected(run_python, tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler to build a stub library")
    source = tmp_path / "other.c"
    source.write_text("int unrelated(void) { return 0; }\n")
    other = tmp_path / "libother.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(other), str(source)], check=True)
    result = run_python(PROBE, environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": str(other)})
    assert result.returncode != 0
    assert "no rt_abi_version" in result.stderr


@pytest.mark.parametrize(
    ("abi_version", "reason"),
    [
        (0x00010009, "incompatible ABI 1.9"),
        (0x00030000, "incompatible ABI 3.0"),
        (0x00020008, "incompatible ABI 2.8"),
        (0x00020009, "incompatible ABI 2.9"),
        (0x0002000A, "incompatible ABI 2.10"),
        (0x0002000B, "incompatible ABI 2.11"),
        (0x0002000C, "incompatible ABI 2.12"),
        (0x0002000D, "incompatible ABI 2.13"),
        (0x0002000E, "incompatible ABI 2.14"),
        (0x0002000F, "ABI 2.15 but a function is missing"),
    ],
)
def test_the_abi_check_rejects_other_majors_older_minors_and_missing_functions(
    run_python, tmp_path, abi_version, reason
):
    stub = compile_stub_library(tmp_path, abi_version)
    result = run_python(PROBE, environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": str(stub)})
    assert result.returncode != 0
    assert f"{stub}: {reason}" in result.stderr


@linux_only
def test_a_source_checkout_finds_its_release_build(run_python, tmp_path):
    checkout = fake_checkout(tmp_path / "checkout")
    expected = place_library(checkout / "build" / "release")
    result = run_python(
        PROBE,
        environment_overrides={
            "RIFTCO_TRANSFORMER_LIBRARY": None,
            "PYTHONPATH": str(checkout / "python"),
        },
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


@linux_only
def test_release_builds_come_before_debug_builds_and_postfixed_names_are_found(
    run_python, tmp_path
):
    checkout = fake_checkout(tmp_path / "checkout")
    debug = place_library(checkout / "build" / "Debug", "libriftco_transformer_c_d.so")
    release = place_library(checkout / "cmake-build-release")
    result = run_python(
        "from riftco_transformer.native import _loader\n"
        "candidates, skipped = _loader.candidate_paths()\n"
        "print('\\n'.join(candidates))",
        environment_overrides={
            "RIFTCO_TRANSFORMER_LIBRARY": None,
            "PYTHONPATH": str(checkout / "python"),
        },
    )
    assert result.returncode == 0, result.stderr
    candidates = result.stdout.split()
    assert candidates.index(str(release)) < candidates.index(str(debug))


@linux_only
def test_a_sanitizer_build_is_skipped_with_its_reason(run_python, tmp_path):
    checkout = fake_checkout(tmp_path / "checkout")
    sanitized = place_library(checkout / "build")
    (checkout / "build" / "CMakeCache.txt").write_text("RIFTCO_TRANSFORMER_SANITIZE:BOOL=ON\n")
    result = run_python(
        "from riftco_transformer.native import _loader\n"
        "candidates, skipped = _loader.candidate_paths()\n"
        "print(repr((candidates, skipped)))",
        environment_overrides={
            "RIFTCO_TRANSFORMER_LIBRARY": None,
            "PYTHONPATH": str(checkout / "python"),
        },
    )
    assert result.returncode == 0, result.stderr
    candidates, skipped = eval(result.stdout)  # a repr of two lists of str
    assert str(sanitized) not in candidates
    assert skipped == [f"{sanitized}: skipped, a sanitizer build"]


@linux_only
def test_an_installed_wheel_loads_the_versioned_library_from_dot_libs(run_python, tmp_path):
    # A wheel installs only the SONAME file (no unversioned link) under riftco_transformer/.libs.
    site = tmp_path / "site-packages"
    package = copy_package(site)
    expected = place_library(package / ".libs", "libriftco_transformer_c.so.2")
    result = run_python(
        PROBE,
        environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": None, "PYTHONPATH": str(site)},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


def test_concurrent_first_uses_load_the_library_once(run_python):
    result = run_python(
        "import threading\n"
        "from riftco_transformer.native import _loader\n"
        "found = []\n"
        "threads = [threading.Thread(target=lambda: found.append(_loader.library())) "
        "for _ in range(16)]\n"
        "[thread.start() for thread in threads]\n"
        "[thread.join() for thread in threads]\n"
        "print(len(found), len({id(library) for library in found}))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["16", "1"]
