"""riftco_transformer.serving as a package: its public names, and that importing it needs
neither the native library nor anything outside the standard library."""

from __future__ import annotations

import riftco_transformer
import riftco_transformer.serving as serving


def test_every_public_name_exists_and_the_list_is_sorted():
    assert serving.__all__ == sorted(serving.__all__)
    for name in serving.__all__:
        assert getattr(serving, name) is not None, name


def test_the_root_package_does_not_reexport_serving_names():
    assert not set(serving.__all__) & set(riftco_transformer.__all__)


def test_importing_serving_loads_no_library_and_no_third_party_module(run_python):
    result = run_python(
        "import json, sys\n"
        "before = set(sys.modules)\n"  # what the interpreter's own startup imported
        "import riftco_transformer.serving\n"
        "from riftco_transformer.native import _loader\n"
        "top = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "outside = top - set(sys.stdlib_module_names) - {'riftco_transformer', '__main__'}\n"
        "print(json.dumps([sorted(outside), _loader._loaded_library is None]))\n",
        environment_overrides={"RIFTCO_TRANSFORMER_LIBRARY": "/nonexistent/library.so"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[], true]"
