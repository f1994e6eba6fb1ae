"""The package's lazy exports stay what they name, whatever was imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("first", ["flexkv_adapter.flexkv", "flexkv_adapter.adapt"])
def test_adapt_is_the_function_after_its_module_was_imported(first):
    """Importing the submodule flexkv_adapter.adapt sets the package attribute 'adapt' to that module, so
    `from flexkv_adapter import adapt` once gave a module ('module' object is not callable)."""
    code = (
        f"import importlib; importlib.import_module({first!r})\n"
        "from flexkv_adapter import adapt\n"
        "import flexkv_adapter\n"
        "assert callable(adapt) and adapt is flexkv_adapter.adapt, adapt\n"
        "from flexkv_adapter.adapt import recognise\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
