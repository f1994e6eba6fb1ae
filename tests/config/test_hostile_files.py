"""Hostile settings and spec files: a clear SettingsError/AdapterError naming the file, never a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, adapt
from flexkv_adapter.cli.main import main
from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError
from flexkv_adapter.readers.spec import LayoutSpec, load_spec, merge_spec_options

LAYOUTS = Path(__file__).parents[2] / "configs" / "layouts"
SPEC = "name: x\naxes: N H D\n"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("FLEXKV_"):
            monkeypatch.delenv(key)


def alias_bomb(levels: int, fan: int = 9) -> str:
    """The classic "billion laughs": each level refers ``fan`` times to the one before."""
    lines = ["a: &a [" + ",".join(["lol"] * fan) + "]"]
    for prev, name in zip("abcdefghij", "bcdefghijk"[: levels - 1]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * fan) + "]")
    return SPEC + "\n".join(lines) + "\n"


def _write(tmp_path: Path, content: str | bytes, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


BAD_CONTENT = {
    "malformed": ("name: [x\naxes: N H D\n", "invalid YAML"),
    "list": ("- a\n- b\n", "YAML mapping"),
    "scalar": ("42\n", "YAML mapping"),
    "python tag": ("name: !!python/object/apply:os.system ['true']\naxes: N H D\n", "invalid YAML"),
    "python name": ("!!python/name:os.system\n", "invalid YAML"),
    "not utf-8": (b"name: \xff\xfe\naxes: N H D\n", "not UTF-8"),
    "control char": ("name: a\x00b\n", "invalid YAML"),
    "two documents": ("a: 1\n---\nb: 2\n", "invalid YAML"),
    "undefined alias": ("name: *nowhere\n", "invalid YAML"),
    "recursive alias": ("name: &a [*a]\naxes: N H D\n", "alias"),
    "alias bomb": (alias_bomb(8), "alias"),
    "deep nesting": ("name: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    "huge int": ("page_size: " + "9" * 5000 + "\n", "invalid"),
    "non-string key": ("1: x\n", "key"),
    "null key": ("?\n", "key"),
    "empty float": ("page_size: !!float\n", "invalid"),
    "empty int": ("!!int\n", "mapping"),  # an empty !!int is text (the environment's rule), not a crash
}


@pytest.mark.parametrize("case", sorted(BAD_CONTENT))
@pytest.mark.parametrize("loader", ["spec", "settings"])
def test_bad_content_names_the_file_and_the_problem(tmp_path, case, loader):
    content, problem = BAD_CONTENT[case]
    path = _write(tmp_path, content)
    if loader == "settings" and problem == "YAML mapping":
        problem = "mapping"
    error = SettingsError if loader == "settings" else AdapterError
    with pytest.raises(error) as info:
        (load_settings if loader == "settings" else load_spec)(path)
    message = str(info.value)
    assert str(path) in message and problem in message, message
    assert len(message) < 2000


@pytest.mark.parametrize("loader", [load_spec, load_settings])
def test_bad_paths(tmp_path, loader):
    error = SettingsError if loader is load_settings else AdapterError
    with pytest.raises(error, match="is a directory"):
        loader(tmp_path)
    with pytest.raises(error, match="NUL"):
        loader(str(tmp_path / "a\0b.yaml"))
    with pytest.raises(error, match="does not exist"):
        loader(tmp_path / "missing.yaml")
    with pytest.raises(error, match="must be a path|the path of"):
        loader(123)  # type: ignore[arg-type]
    with pytest.raises(error, match="larger than"):
        loader(_write(tmp_path, "# " + "x" * (2 << 20) + "\n"))


@pytest.mark.parametrize("loader", [load_spec, load_settings])
def test_a_fifo_is_refused_without_opening_it(tmp_path, loader):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def attempt():
        try:
            loader(fifo)
        except BaseException as exc:  # reported to the test thread
            outcome.append(exc)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader so the thread ends, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO hung")
    assert isinstance(outcome[0], AdapterError) and "not a regular file" in str(outcome[0])


def test_the_alias_bomb_message_is_small_and_quick(tmp_path):
    small = _write(tmp_path, alias_bomb(4, 9), "small.yaml")  # 9**4 expanded nodes
    with pytest.raises(AdapterError) as info:
        load_spec(small)
    assert len(str(info.value)) < 2000


def test_error_messages_truncate_user_input(tmp_path):
    long = "q" * 100_000
    for content in (f"name: x\naxes: N H D\ndtype: {long}\n", f"name: x\naxes: {long} D\n", f"{long}: 1\n"):
        with pytest.raises(AdapterError) as info:
            load_spec(_write(tmp_path, content))
        assert len(str(info.value)) < 2000
        with pytest.raises(SettingsError) as info:
            load_settings(_write(tmp_path, content.replace("name: x\naxes", "hybrid: a\nxaxes")))
        assert len(str(info.value)) < 2000


@pytest.mark.parametrize("field", ["page_size", "layer_num", "head_num"])
def test_booleans_are_not_numbers_in_specs(field):
    with pytest.raises(AdapterError, match=f"{field}=True"):
        load_spec({"name": "x", "axes": "N H D", field: True})
    with pytest.raises(AdapterError, match="layer_ids"):
        load_spec({"name": "x", "axes": "N H D", "layer_ids": [True, 2]})


def test_yes_is_not_a_page_size(tmp_path):
    with pytest.raises(AdapterError, match="page_size"):
        load_spec(_write(tmp_path, SPEC + "page_size: yes\n"))
    with pytest.raises(SettingsError, match="page_size"):
        load_settings(_write(tmp_path, "page_size: yes\n"))
    with pytest.raises(SettingsError, match="align_timeout_s"):
        load_settings(align_timeout_s=True)
    with pytest.raises(SettingsError, match="align_timeout_s"):
        load_settings(align_timeout_s=float("nan"))


def test_attrs_as_a_tuple_agree_with_the_same_attrs_as_a_list():
    spec = LayoutSpec(name="x", attrs=["kv_cache"], axes="N H D", layer_ids=[3, 4])
    merged = merge_spec_options(spec, {"attrs": ("kv_cache",), "layer_ids": (3, 4)})
    assert merged["attrs"] == ["kv_cache"] or tuple(merged["attrs"]) == ("kv_cache",)
    pool = SimpleNamespace(kv_cache=[torch.zeros(32, 1, 8)] * 2, page_size=16)
    assert adapt(pool, spec=spec, attrs=("kv_cache",)).report.recognizer == "spec:x"
    with pytest.raises(AdapterError, match="contradicts"):
        merge_spec_options(spec, {"attrs": ("other",)})


class _Weird:
    pass


@pytest.mark.parametrize("answer", [42, b"bytes", ["a", "b"], _Weird(), object()])
def test_a_plugin_returning_a_non_spec_is_named(monkeypatch, answer):
    from flexkv_adapter.readers import plugins

    monkeypatch.setattr(plugins, "recognizers", lambda: (("odd-plugin", lambda pool: answer),))
    with pytest.raises(AdapterError, match="recogniser plugin odd-plugin returned"):
        plugins.plugin_spec(SimpleNamespace())


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "0"])
def test_an_unspecified_address_is_not_a_master(host):
    with pytest.raises(SettingsError, match="master_host.*not the address of a master"):
        load_settings(master_host=host)


def test_inspect_reports_every_file_and_fails_if_any_failed(tmp_path, capsys):
    good = LAYOUTS / "sglang-mha.yaml"
    bad_yaml = _write(tmp_path, "name: [x\n", "bad.yaml")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert main(["inspect", str(bad_yaml), str(tmp_path), str(fifo), str(good)]) == 1
    out, err = capsys.readouterr()
    assert out.count("verdict:") == 1
    lines = err.splitlines()
    assert [str(bad_yaml) in lines[0], str(tmp_path) in lines[1], str(fifo) in lines[2]] == [True] * 3


def test_doctor_reports_a_bad_config_file(tmp_path, capsys):
    import json

    assert main(["doctor", "--json", "--config", str(_write(tmp_path, "- 1\n"))]) == 1
    result = json.loads(capsys.readouterr().out)
    check = next(c for c in result["checks"] if c["name"] == "settings")
    assert check["status"] == "error" and "mapping" in check["detail"]
    assert main(["doctor", "--json", "--config", str(_write(tmp_path, "master_host: 0.0.0.0\n"))]) == 1


def test_inspect_json_into_a_closed_pipe_prints_no_traceback():
    specs = [str(p) for p in sorted(LAYOUTS.glob("*.yaml"))] * 200
    exe = Path(sys.executable).with_name("flexkv-adapter")
    done = subprocess.run(
        f"'{exe}' inspect --json {' '.join(specs)} | head -1", shell=True, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.count("\n") == 1
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_a_huge_path_is_clipped_in_the_message():
    with pytest.raises(AdapterError) as info:
        load_spec("/tmp/" + "d" * 100_000 + ".yaml")
    assert "File name too long" in str(info.value) and len(str(info.value)) < 500


class BrokenPath(os.PathLike):
    def __fspath__(self) -> str:
        raise RuntimeError("no path today")


@pytest.mark.parametrize("source", [BrokenPath(), b"configs/layouts/sglang-mha.yaml"])
def test_path_objects_that_are_not_text_paths(source):
    with pytest.raises(AdapterError, match="path"):
        load_spec(source)
    with pytest.raises(SettingsError, match="path"):
        load_settings(source)


def test_the_cli_shows_every_settings_problem_on_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLEXKV_ADAPTER_HYBRID", "maybe")
    monkeypatch.setenv("FLEXKV_ADAPTER_TP_SIZE", "true")
    monkeypatch.setattr("flexkv_adapter.cli.main._cmd_demo", lambda args: load_settings() and 0)
    assert main(["demo"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: invalid settings:") and "hybrid='maybe'" in line and "tp_size='true'" in line


def test_adapt_and_doctor_refuse_a_fifo_and_a_directory(tmp_path, capsys):
    import json

    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    pool = SimpleNamespace(kv_cache=[torch.zeros(32, 1, 8)] * 2, page_size=16)
    for bad in (fifo, tmp_path, _write(tmp_path, "name: x\naxes: N H D\npage_size: yes\n")):
        with pytest.raises(AdapterError, match=str(bad)):
            adapt(pool, spec=bad)
        assert main(["doctor", "--json", "--config", str(bad)]) == 1
        check = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "settings")
        assert check["status"] == "error" and str(bad) in check["detail"]
