"""Runs the Python package's pytest suite for CTest (``python.pytest``), or reports it skipped.

Exit 77 (the test's SKIP_RETURN_CODE) with the reason when this interpreter cannot import
pytest (a machine without ``python3-pytest``); otherwise ``python -m pytest <arguments>``'s
own exit status (pytest never exits 77).
"""

from __future__ import annotations

import subprocess
import sys

SKIP = 77


def main() -> int:
    try:
        import pytest  # noqa: F401 (only whether it imports matters here)
    except Exception as error:  # noqa: BLE001 - any import failure means "cannot run pytest"
        print(
            f"skipped: pytest is not importable by {sys.executable} ({error}); install "
            "python3-pytest (or `pip install pytest`) to run tests/python"
        )
        return SKIP
    completed = subprocess.run([sys.executable, "-m", "pytest", *sys.argv[1:]])
    return completed.returncode if completed.returncode >= 0 else 1  # < 0: killed by a signal


if __name__ == "__main__":
    sys.exit(main())
