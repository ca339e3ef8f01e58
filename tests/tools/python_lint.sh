#!/usr/bin/env bash
# style.python_lint: ruff (pyproject.toml's [tool.ruff]) over the package, python/. Any finding
# fails the test, so CI fails on it. Ruff comes from PyPI into a cached virtual environment
# outside the repository, named by $RIFTCO_TRANSFORMER_LINT_PYTHON (.ci/run makes it); without
# it the test reports itself skipped (77) and says why.
set -uo pipefail
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
lint_python="${RIFTCO_TRANSFORMER_LINT_PYTHON:-}"
if [[ -z "$lint_python" ]] || ! "$lint_python" -m ruff --version >/dev/null 2>&1; then
    echo "skipped: no ruff (set RIFTCO_TRANSFORMER_LINT_PYTHON to a Python with ruff installed;" \
         ".ci/run makes ~/.cache/riftco-transformer/lint-venv)"
    exit 77
fi
cd "$source_dir"
"$lint_python" -m ruff --version
exec "$lint_python" -m ruff check --no-cache python/
