#!/usr/bin/env bash
# style.clang_tidy: clang-tidy 14 (Debian 12's) with the repository's .clang-tidy over the
# sources of src/ that a build compiles, every warning an error.
#   clang_tidy_check.sh BUILD_DIR FILE_REGEX
# BUILD_DIR holds the build's compile_commands.json; FILE_REGEX (a run-clang-tidy regex over
# absolute paths) picks the sources: each build configuration checks what only it compiles
# (tests/CMakeLists.txt), so a CI run covers every source once. Skipped (77), saying why,
# without clang-tidy 14 and run-clang-tidy or without the compilation database.
set -uo pipefail
build_dir="$1"
files="$2"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v clang-tidy >/dev/null 2>&1 || ! command -v run-clang-tidy >/dev/null 2>&1; then
    echo "skipped: clang-tidy or run-clang-tidy is not installed (bash tools/bootstrap.sh" \
         "--tests installs clang-tidy)"
    exit 77
fi
version="$(clang-tidy --version | grep -o 'version [0-9.]*' | head -n 1)"
if [[ ! "$version" =~ ^version\ 14\. ]]; then
    echo "skipped: clang-tidy $version is not clang-tidy 14, the version .clang-tidy is kept clean for"
    exit 77
fi
if [[ ! -f "$build_dir/compile_commands.json" ]]; then
    echo "skipped: $build_dir has no compile_commands.json"
    exit 77
fi
cd "$source_dir"
jobs="$(nproc 2>/dev/null || echo 2)"
# GCC's optimize("fp-contract=off") attribute is unknown to clang: not a finding.
output="$(run-clang-tidy -p "$build_dir" -j "$jobs" -quiet -extra-arg=-Wno-unknown-attributes \
    "$files" 2>&1)"
status=$?
findings="$(grep -E '(warning|error): ' <<<"$output" | sed 's/\x1b\[[0-9;]*m//g' | sort -u)"
checked="$(grep -c '^clang-tidy' <<<"$output")"
if [[ -n "$findings" || $status -ne 0 ]]; then
    echo "$findings"
    [[ -n "$findings" ]] || tail -n 40 <<<"$output"
    echo "clang-tidy $version: $checked files matching $files, $(grep -c . <<<"$findings") findings (status $status)"
    exit 1
fi
echo "clang-tidy $version: $checked files matching $files, no findings"
