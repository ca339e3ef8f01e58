#!/usr/bin/env bash
# The Debian packages riftco-transformer needs, and their installation: the first step of
# README.md's two commands and of .ci/run.
#
#   bash tools/bootstrap.sh           what the main job needs (cmake --build --preset release
#                                     builds the library, examples, tests and benchmarks)
#   bash tools/bootstrap.sh --tests   that and what every test workflow needs
#   bash tools/bootstrap.sh --check   (with or without --tests) installs nothing: says what is
#                                     missing and the command that installs it
#   bash tools/bootstrap.sh --list    (with or without --tests) prints the package names
#   further arguments                 more package names to require (tests/tools uses one that
#                                     cannot exist)
#
# With nothing missing it prints nothing and exits 0 (one dpkg-query call). With packages
# missing it installs them with apt-get when it may: as root, or through sudo when sudo works
# without a password (sudo -n). Otherwise, and always with --check, it prints the one command
# to run and exits 1. It needs bash and dpkg (and apt to install). Without dpkg-query (not a
# Debian/Ubuntu system) it names the Debian packages whose equivalents to install and exits 0,
# leaving CMake to report what is really missing.
set -euo pipefail

# One list: "build" packages are needed by the main job, "tests" packages only by the test
# workflows (README's second command, .ci/run).
package_list='
build  build-essential          g++ >= 12, make, binutils (nm, objdump)
build  cmake                    >= 3.25 (the presets)
build  ninja-build              the presets generator
build  libgtest-dev             the GoogleTest suites (built by the release preset)
build  libbenchmark-dev         the Google Benchmark programs (built by the release preset)
build  libdnnl-dev              oneDNN GEMM (the benchmarked build)
build  libopenblas-openmp-dev   OpenBLAS GEMM (RIFTCO_TRANSFORMER_GEMM=openblas, the wheel)
build  libpcre2-dev             the pre-tokenizers regex engine (linked statically)
tests  python3                  tests/python and the oracles
tests  python3-pytest           runs tests/python
tests  python3-venv             the wheel test builds and installs the package in fresh venvs
tests  python3-torch            oracle.pytorch_parity
tests  python3-jinja2           chat-template tests compare renderers with the Jinja text
tests  chromium                 the chat page headless browser test
tests  clang                    the GGUF fuzz smoke (libFuzzer) ...
tests  libclang-rt-14-dev       ... with its runtime (libFuzzer, ASan)
tests  libomp-14-dev            ... and OpenMP
tests  openmpi-bin              the mpi preset runs its tests under mpirun
tests  libopenmpi-dev           the mpi preset links Open MPI
tests  ccache                   .ci/run compiles through it when present
tests  clang-format             style.clang_format (the C/C++ formatting check)
tests  clang-tidy               style.clang_tidy (.clang-tidy over src/; run-clang-tidy)
tests  libgmock-dev             nothing uses it today (GTest config loads it if present); CI had it
tests  pkg-config               nothing calls it today; CI had it
'

self="tools/bootstrap.sh"
want_tests=0 check_only=0 list_only=0
extra=()
for argument in "$@"; do
    case "$argument" in
        --tests) want_tests=1 ;;
        --check) check_only=1 ;;
        --list) list_only=1 ;;
        -h|--help)
            sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
            exit 0 ;;
        -*) echo "$self: unknown option '$argument' (see --help)" >&2; exit 2 ;;
        *) extra+=("$argument") ;;
    esac
done

packages=()
while read -r group package _; do
    [[ -n "${package:-}" ]] || continue
    if [[ "$group" == build ]] || ((want_tests)); then
        packages+=("$package")
    fi
done <<< "$package_list"
packages+=("${extra[@]+"${extra[@]}"}")

if ((list_only)); then
    printf '%s\n' "${packages[@]}"
    exit 0
fi

what="the build needs"
((want_tests)) && what="the build and the tests need"

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "$self: no dpkg-query (not Debian/Ubuntu), nothing installed; $what the" \
         "equivalents of these Debian packages: ${packages[*]}" >&2
    exit 0
fi

# One query for every package: "name status" for each one dpkg knows of (the second letter of
# the abbreviated status is 'i' once it is installed and configured); unknown names print
# nothing on stdout.
declare -A installed=()
while read -r name status; do
    [[ "${status:1:1}" == i ]] && installed["$name"]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${packages[@]}" 2>/dev/null || true)

missing=()
for package in "${packages[@]}"; do
    [[ -n "${installed[$package]:-}" ]] || missing+=("$package")
done
((${#missing[@]})) || exit 0

install_args=(install -y --no-install-recommends "${missing[@]}")
command_line="sudo apt-get update && sudo apt-get ${install_args[*]}"

as=(env DEBIAN_FRONTEND=noninteractive)
if ((!check_only)) && [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
        as=(sudo -n "${as[@]}")
    else
        check_only=1
    fi
fi

if ((check_only)); then
    {
        echo "$self: ${#missing[@]} Debian package(s) that $what are missing:" \
             "${missing[*]}"
        echo "Install them with this command (as a user who may use sudo; as root, without"
        echo "'sudo'), then run this again:"
        echo
        echo "    $command_line"
        echo
    } >&2
    exit 1
fi

echo "$self: installing ${#missing[@]} missing Debian package(s): ${missing[*]}" >&2
if ! "${as[@]}" apt-get update -qq || ! "${as[@]}" apt-get -qq "${install_args[@]}"; then
    echo "$self: apt-get could not install them; the command was:" >&2
    echo "    $command_line" >&2
    exit 1
fi
