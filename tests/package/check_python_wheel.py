#!/usr/bin/env python3
"""Builds the wheel with `pip wheel`, installs it into a fresh virtual environment and uses it.

Checks, in order:
  0. CMAKE_ARGS reaches the CMake configure step: with -DRIFTCO_TRANSFORMER_ENABLE_METAL=ON
     (rejected at configure time by this version) the build fails with that option's message.
  1. `pip wheel <source>` builds one py3-none-<platform> wheel through scikit-build-core
     (CMAKE_ARGS from the environment passes through; this script adds the ccache launcher
     when ccache exists).
  2. The wheel installs with `pip install --no-index` into a fresh virtual environment (no
     system site-packages), so it needs no runtime dependency.
  3. From a directory outside the source tree and without RIFTCO_TRANSFORMER_LIBRARY, the
     package loads the library from riftco_transformer/.libs and runs the seed's tensor
     snippet (prints (2, 2) and [58.0, 64.0, 139.0, 154.0]); its pure-Python subpackages
     (riftco_transformer.serving) come from the wheel too; the `riftco` console script is
     installed and `riftco demo` runs on the demo data the wheel carries.
  4. The installed library depends on nothing beyond the C/C++ runtime, libgomp and what the
     wheel carries beside it (the GEMM library) (ldd), and names its GEMM kernel (cpu_info),
     and its SONAME still carries the ABI major (readelf) although the file has the plain name.

Exit 77 (CTest skip) only when the build front end cannot be obtained (no venv module, or
scikit-build-core cannot be downloaded); every other failure is a test failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SKIP = 77

# Shared objects the installed library may load: the C and C++ runtimes and OpenMP.
ALLOWED_DEPENDENCIES = re.compile(
    r"^(linux-vdso\.so\.1|ld-linux[-\w.]*\.so\.\d+|libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|"
    r"libgcc_s\.so\.1|libgomp\.so\.1|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1)$"
)


def run(command: list[str], description: str, **kwargs) -> subprocess.CompletedProcess:
    print(f"+ {' '.join(map(str, command))}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"{description} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    args = parser.parse_args()
    source = args.source_dir.resolve()
    work = args.work_dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 1. A build environment with the build backend.
    builder = work / "build-venv"
    if subprocess.run([sys.executable, "-m", "venv", str(builder)]).returncode != 0:
        print("skipped: the venv module (python3-venv) is missing")
        return SKIP
    fetched = subprocess.run(
        [str(venv_python(builder)), "-m", "pip", "install", "-q", "scikit-build-core>=0.9"],
        capture_output=True, text=True)
    if fetched.returncode != 0:
        print(f"skipped: cannot install scikit-build-core:\n{fetched.stderr}")
        return SKIP

    environment = dict(os.environ)
    environment.pop("RIFTCO_TRANSFORMER_LIBRARY", None)
    environment.pop("PYTHONPATH", None)
    if shutil.which("ccache"):
        launcher = "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
        environment["CMAKE_ARGS"] = f"{environment.get('CMAKE_ARGS', '')} {launcher}".strip()
        environment.setdefault("CCACHE_BASEDIR", str(source))
    # 0. Build options pass through CMAKE_ARGS.
    probe_environment = dict(environment)
    probe_environment["CMAKE_ARGS"] = (
        f"{environment.get('CMAKE_ARGS', '')} -DRIFTCO_TRANSFORMER_ENABLE_METAL=ON".strip())
    rejected = subprocess.run(
        [str(venv_python(builder)), "-m", "pip", "wheel", str(source), "--no-build-isolation",
         "--no-deps", "-w", str(work / "probe-dist")],
        capture_output=True, text=True, env=probe_environment)
    rejected_output = rejected.stdout + rejected.stderr
    # CMake's own message (CMakeLists.txt), with its line wrapping undone.
    expected = "RIFTCO_TRANSFORMER_ENABLE_METAL=ON: this version ships only the unavailable METAL stub"
    if rejected.returncode == 0 or expected not in " ".join(rejected_output.split()):
        sys.exit(f"CMAKE_ARGS=-DRIFTCO_TRANSFORMER_ENABLE_METAL=ON did not reach CMake:\n"
                 f"{rejected_output}")
    print("CMAKE_ARGS reaches CMake: ok")

    dist = work / "dist"
    run([str(venv_python(builder)), "-m", "pip", "wheel", str(source), "--no-build-isolation",
         "--no-deps", "-w", str(dist)], "pip wheel", env=environment)
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        sys.exit(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    wheel = wheels[0]
    if not re.match(r"riftco_transformer-[\w.]+-py3-none-\w+\.whl$", wheel.name):
        sys.exit(f"wheel {wheel.name} is not tagged py3-none-<platform>")
    print(f"built {wheel.name}")

    # 2. A fresh environment that gets nothing but the wheel.
    fresh = work / "fresh-venv"
    run([sys.executable, "-m", "venv", str(fresh)], "creating the fresh virtual environment")
    run([str(venv_python(fresh)), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         str(wheel)], "installing the wheel", env=environment)

    # 3. Use it from outside the source tree.
    outside = work / "outside"
    outside.mkdir()
    probe = ("import riftco_transformer, riftco_transformer.native._loader as loader; "
             "print(loader.library()._name)")
    loaded = run([str(venv_python(fresh)), "-c", probe], "importing the installed package",
                 cwd=outside, env=environment).stdout.strip().splitlines()[-1]
    library = Path(loaded).resolve()
    expected_directory = (fresh / "lib").resolve()
    if ".libs" not in library.parts or expected_directory not in library.parents:
        sys.exit(f"the package loaded {library}, not the wheel's riftco_transformer/.libs copy")
    print(f"loaded {library}")
    serving = run([str(venv_python(fresh)), "-c",
                   "import riftco_transformer.serving as serving; print(serving.__file__)"],
                  "importing riftco_transformer.serving", cwd=outside,
                  env=environment).stdout.strip().splitlines()[-1]
    if expected_directory not in Path(serving).resolve().parents:
        sys.exit(f"riftco_transformer.serving came from {serving}, not the installed wheel")
    print("riftco_transformer.serving: ok")
    # PEP 561: the installed package says it carries its type annotations.
    typed = Path(serving).resolve().parent.parent / "py.typed"
    if not typed.is_file():
        sys.exit(f"the installed package has no py.typed marker (looked for {typed})")
    print("py.typed: ok")
    snippet = source / "examples" / "python" / "tensor_snippet.py"
    output = run([str(venv_python(fresh)), str(snippet)], "the tensor snippet", cwd=outside,
                 env=environment).stdout.splitlines()
    if output != ["(2, 2)", "[58.0, 64.0, 139.0, 154.0]"]:
        sys.exit(f"the tensor snippet printed {output}")
    print("tensor snippet: ok")
    # The console script, and the demo on the data the wheel carries (not the source tree's).
    script = fresh / ("Scripts/riftco.exe" if os.name == "nt" else "bin/riftco")
    if not script.is_file():
        sys.exit(f"the wheel installed no riftco console script at {script}")
    usage = run([str(script), "--help"], "riftco --help", cwd=outside, env=environment).stdout
    if "pretrain" not in usage or "post-train" not in usage:
        sys.exit(f"riftco --help lists no subcommands:\n{usage}")
    demo = run([str(script), "demo", "--steps", "10", "--post-train-steps", "5", "--output-dir",
                str(outside / "demo")], "riftco demo", cwd=outside, env=environment).stdout
    if "demo_data" not in str(next((fresh / "lib").rglob("tiny_instructions.jsonl"), "")) or \
            "demo: done" not in demo:
        sys.exit(f"riftco demo did not run on the wheel's demo data:\n{demo}")
    print("riftco console script and demo: ok")

    # 4. Runtime dependencies of the installed library.
    if shutil.which("ldd"):
        listing = run(["ldd", str(library)], "ldd").stdout
        names, unexpected = [], []
        for line in listing.splitlines():
            if not line.strip():
                continue
            name = line.split()[0]
            names.append(name)
            resolved = line.split("=>")[1].split()[0] if "=>" in line else ""
            # Beside the library in the wheel (the bundled GEMM library) is part of the wheel.
            bundled = resolved and Path(resolved).resolve().parent == library.resolve().parent
            if not bundled and not ALLOWED_DEPENDENCIES.match(Path(name).name):
                unexpected.append(name)
        if unexpected:
            sys.exit(f"the installed library depends on {unexpected}:\n{listing}")
        print(f"runtime dependencies: {', '.join(Path(name).name for name in names)}")
        info = run([str(venv_python(fresh)), "-c",
                    "import riftco_transformer; print(riftco_transformer.cpu_info())"],
                   "cpu_info", cwd=outside, env=environment).stdout.strip()
        print(f"cpu_info: {info}")
        if "generic" in info.lower() or "prescott" in info.lower():
            sys.exit(f"the wheel's GEMM runs a generic kernel: {info}")
    if shutil.which("readelf"):
        dynamic = run(["readelf", "-d", str(library)], "readelf").stdout
        if "[libriftco_transformer_c.so.2]" not in dynamic:
            sys.exit(f"the installed library's SONAME does not carry ABI major 2:\n{dynamic}")
        print("SONAME libriftco_transformer_c.so.2: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
