#!/usr/bin/env bash
# style.clang_format: every tracked C/C++ file matches clang-format's output of .clang-format.
# Needs git and clang-format 14 (Debian 12's, whose output the tree is kept in); another
# version or none: skipped (77), saying why.
set -uo pipefail
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v clang-format >/dev/null 2>&1; then
    echo "skipped: clang-format is not installed (bash tools/bootstrap.sh --tests installs it)"
    exit 77
fi
version="$(clang-format --version)"
if [[ ! "$version" =~ version\ 14\. ]]; then
    echo "skipped: $version is not clang-format 14, whose output the tree is kept in"
    exit 77
fi
if ! git -C "$source_dir" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "skipped: $source_dir is not a git checkout (the tracked files are the ones checked)"
    exit 77
fi
cd "$source_dir"
failures=0
checked=0
while IFS= read -r file; do
    checked=$((checked + 1))
    if ! clang-format --dry-run --Werror "$file" >/dev/null 2>&1; then
        echo "$file differs from clang-format's output (clang-format -i $file):"
        clang-format --dry-run "$file" 2>&1 | head -n 20
        failures=$((failures + 1))
    fi
done < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh')
echo "$version: $checked files, $failures problems"
((failures == 0))
