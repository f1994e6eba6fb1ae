"""The package's lazy exports stay functions even after submodules are imported."""

from __future__ import annotations

import subprocess
import sys


def test_adapt_is_the_function_after_the_flexkv_subpackage_is_imported():
    # A submodule named like an export would shadow it once imported (the package attribute wins).
    code = (
        "import flexkv_adapter.flexkv, flexkv_adapter.integrations.sglang.plugin\n"
        "import flexkv_adapter as fa\n"
        "from flexkv_adapter import adapt\n"
        "assert callable(adapt) and adapt.__module__.startswith('flexkv_adapter'), adapt\n"
        "for name in fa.__all__:\n"
        "    assert not type(getattr(fa, name)).__name__ == 'module', name\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dir_lists_every_lazy_export_before_it_is_imported():
    code = "import flexkv_adapter as fa, sys\nprint(sorted(set(fa.__all__) - set(dir(fa))), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["[]", "False"]  # all listed, and listing them imported nothing heavy


def test_python_dash_m_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "flexkv_adapter", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("flexkv-adapter ")
