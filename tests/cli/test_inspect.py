"""inspect names the spec key it shows (attrs), and a spec written with the old label gets pointed to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flexkv_adapter.errors import AdapterError
from flexkv_adapter.readers.spec import load_spec

EXE = Path(sys.executable).with_name("flexkv-adapter")
SPEC = "name: mine\n{key}: [k_buffer, v_buffer]\naxes: N H D\n"


def _inspect(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "inspect", *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_inspect_labels_the_tensor_names_with_the_spec_key_attrs(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text(SPEC.format(key="attrs"))
    done = _inspect(spec)
    assert done.returncode == 0, done.stderr
    assert "\n  attrs: k_buffer/v_buffer\n" in done.stdout and "tensors:" not in done.stdout


def test_a_tensors_key_in_a_layout_spec_gets_a_did_you_mean_pointing_to_attrs(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text(SPEC.format(key="tensors"))
    done = _inspect(spec)
    assert done.returncode == 1 and done.stdout == ""
    assert "tensors=['k_buffer', 'v_buffer']: unknown key (did you mean attrs?)" in done.stderr, done.stderr
    with pytest.raises(AdapterError, match=r"unknown key \(did you mean attrs\?\)"):  # the API's reading too
        load_spec({"name": "m", "tensors": ["k_buffer", "v_buffer"], "axes": "N H D"})


@pytest.mark.parametrize("key", ["colour", "tensor_names"])
def test_other_unknown_keys_are_not_sent_to_attrs(key):
    """The control: the rule is for `tensors` (what inspect used to print), not every unknown key."""
    with pytest.raises(AdapterError) as raised:
        load_spec({"name": "m", key: ["k_buffer"], "axes": "N H D"})
    assert "did you mean attrs" not in str(raised.value) and "known keys: attrs, axes" in str(raised.value)
