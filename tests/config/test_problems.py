"""config.problems: one did-you-mean for environment variables, settings keys and layout spec keys, and
the quoted-number hint for values that came from YAML."""

from __future__ import annotations

import os
import string
import tempfile
import time
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter.config.problems import close_names, did_you_mean, reach
from flexkv_adapter.config.settings import ENV_PREFIX, AdapterSettings, _known_env, load_settings
from flexkv_adapter.errors import AdapterError, SettingsError
from flexkv_adapter.readers.spec import LayoutSpec, load_spec

SETTINGS = tuple(AdapterSettings.model_fields)
SPEC = tuple(LayoutSpec.model_fields)
ALPHABET = string.ascii_lowercase + string.digits + "_"
FILES = settings(max_examples=min(settings.default.max_examples, 300))  # each example writes and reads a file
NAMES = settings(max_examples=min(settings.default.max_examples, 600))  # 34 distances an example


@cache
def _one_edit_away(name: str) -> frozenset[str]:
    """Every name one insertion, deletion, substitution or swap of neighbours from ``name``, by enumeration
    (independent of the distance the module computes)."""
    out = {name[:i] + c + name[i:] for i in range(len(name) + 1) for c in ALPHABET}
    out |= {name[:i] + name[i + 1 :] for i in range(len(name))}
    out |= {name[:i] + c + name[i + 1 :] for i in range(len(name)) for c in ALPHABET}
    out |= {name[:i] + name[i + 1] + name[i] + name[i + 2 :] for i in range(len(name) - 1)}
    return frozenset(out - {name})


@st.composite
def near_misses(draw: st.DrawFn, known: tuple[str, ...]) -> tuple[str, str]:
    """(a known name, a typo of it one edit away that is no known name)."""
    name = draw(st.sampled_from(known))
    typo = draw(st.sampled_from(sorted(_one_edit_away(name) - set(known))))
    return name, typo


def _alone(name: str, typo: str, known: tuple[str, ...]) -> bool:
    """Whether ``name`` is the only known name one edit from ``typo``."""
    return not any(typo in _one_edit_away(k) for k in known if k != name)


# names of characters no known name holds: no suggestion can be honest
far_keys = st.text(alphabet=string.digits + ".~", min_size=1, max_size=40)


@pytest.mark.parametrize("known", [SETTINGS, SPEC], ids=["settings", "spec"])
@NAMES
@given(data=st.data())
def test_a_typo_one_edit_away_is_answered_with_the_name_it_came_from(known, data):
    name, typo = data.draw(near_misses(known))
    found = close_names(typo, known)
    assert name in found
    if _alone(name, typo, known):
        assert found == [name]


@pytest.mark.parametrize("known", [SETTINGS, SPEC], ids=["settings", "spec"])
@NAMES
@given(key=far_keys)
def test_a_far_name_gets_no_suggestion(known, key):
    assert close_names(key, known) == [] and did_you_mean(key, known) == ""


@given(name=st.sampled_from(SETTINGS), upper=st.booleans())
def test_case_and_dashes_do_not_count_as_edits(name, upper):
    typed = name.replace("_", "-")
    assert close_names(typed.upper() if upper else typed, SETTINGS) == [name]


def test_a_typo_between_two_names_names_both():
    assert close_names("health_post", SETTINGS) == ["health_host", "health_port"]
    assert did_you_mean("health_post", SETTINGS) == " (did you mean health_host or health_port?)"


def test_only_names_with_the_prefix_compete_and_the_prefix_is_no_likeness():
    known = _known_env()
    assert close_names(f"{ENV_PREFIX}TP_SIZ", known, ENV_PREFIX) == [f"{ENV_PREFIX}TP_SIZE"]
    # every FLEXKV_ADAPTER_ name shares 15 characters with this one; none is near it
    assert close_names(f"{ENV_PREFIX}QQQQQQ", known, ENV_PREFIX) == []


def test_a_huge_name_is_answered_at_once():
    started = time.monotonic()
    assert close_names("page_size" * 20_000, SETTINGS) == []
    assert time.monotonic() - started < 1.0


def test_reach_grows_with_the_name():
    assert [reach("x" * n) for n in (1, 4, 5, 9, 10, 20)] == [1, 1, 2, 2, 3, 5]


# --- through the real ways in ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_flexkv_environment():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXKV_")}
    with mock.patch.dict(os.environ, clean, clear=True):
        yield


def _file(text: str) -> Path:
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115
    with handle:
        handle.write(text)
    return Path(handle.name)


def _refusal(load, path: Path) -> str:
    try:
        with pytest.raises(AdapterError) as caught:
            load(path)
        return str(caught.value)
    finally:
        path.unlink()


@FILES
@given(pair=near_misses(SETTINGS))
def test_a_misspelt_settings_key_in_yaml_names_the_file_the_key_and_the_setting(pair):
    name, typo = pair
    path = _file(f"'{typo}': 1\n")
    message = _refusal(load_settings, path)
    assert f"{typo}=1 (from file {path}): unknown key (did you mean " in message
    assert name in message.split("did you mean ", 1)[1]


@FILES
@given(pair=near_misses(SPEC))
def test_a_misspelt_spec_key_in_yaml_names_the_file_the_key_and_the_spec_key(pair):
    name, typo = pair
    path = _file(f"name: x\naxes: L KV P T H D\n'{typo}': 1\n")
    message = _refusal(load_spec, path)
    assert f"invalid layout spec ({path}): " in message and f"{typo}=1: unknown key (did you mean " in message
    assert name in message.split("did you mean ", 1)[1]


@FILES
@given(key=far_keys)
def test_a_far_key_in_yaml_gets_the_known_keys_and_no_guess(key):
    for load, text in [(load_settings, f"'{key}': 1\n"), (load_spec, f"name: x\naxes: N H D\n'{key}': 1\n")]:
        message = _refusal(load, _file(text))
        assert "did you mean" not in message and message.count("known keys: ") == 1


@FILES
@given(typo=st.sampled_from(sorted(_one_edit_away("page_size") - set(SETTINGS) - set(SPEC))))
def test_environment_settings_and_specs_answer_one_typo_alike(typo):
    """page_size is a setting and a spec key: its typo gets one answer on every way in."""
    expected = did_you_mean(typo, ["page_size"])
    assert expected == " (did you mean page_size?)"
    with mock.patch.dict(os.environ, {f"{ENV_PREFIX}{typo.upper()}": "1"}), pytest.raises(SettingsError) as env:
        load_settings()
    assert f"{ENV_PREFIX}{typo.upper()} (did you mean {ENV_PREFIX}PAGE_SIZE?)" in str(env.value)
    with pytest.raises(SettingsError, match=rf"{typo}=1 \(from argument\): unknown key \(did you mean page_size\?\)"):
        load_settings(**{typo: 1})
    with pytest.raises(AdapterError, match=rf"{typo}=1: unknown key \(did you mean page_size\?\)"):
        load_spec({"name": "x", "axes": "N H D", typo: 1})


def test_a_far_environment_variable_gets_no_guess():
    """Every FLEXKV_ADAPTER_ variable shares the prefix: likeness is measured after it."""
    with mock.patch.dict(os.environ, {f"{ENV_PREFIX}QQQQQQ": "1"}), pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == f"unknown environment variable(s): {ENV_PREFIX}QQQQQQ"


def test_correct_keys_load(tmp_path):
    """The negative control: the keys the typos came from are accepted, from YAML and the environment."""
    path = tmp_path / "s.yaml"
    path.write_text("page_size: 16\ntp_size: 2\nalign_timeout_s: 5\nmaster_ports: [6000, 6001, 6002]\n")
    got = load_settings(path)
    assert (got.page_size, got.tp_size, got.align_timeout_s, got.master_ports) == (16, 2, 5, (6000, 6001, 6002))
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\naxes: L KV P T H D\npage_size: 16\nhead_dim: 8\n")
    assert (load_spec(spec).page_size, load_spec(spec).head_dim) == (16, 8)
    with mock.patch.dict(os.environ, {f"{ENV_PREFIX}PAGE_SIZE": "16"}):
        assert load_settings().page_size == 16


# --- quoted numbers ------------------------------------------------------------------------------------------

UNQUOTED = "YAML numbers are written unquoted"


@FILES
@given(
    field=st.sampled_from(["page_size", "tp_size", "nnodes", "register_attempts", "align_timeout_s", "grace_s"]),
    number=st.integers(1, 10**6),
    quote=st.sampled_from(["'", '"']),
)
def test_a_quoted_number_in_settings_yaml_is_told_to_drop_the_quotes(field, number, quote):
    path = _file(f"{field}: {quote}{number}{quote}\n")
    message = _refusal(load_settings, path)
    assert f"(from file {path})" in message
    assert f'{UNQUOTED}: {field}: {number}, not {field}: "{number}"' in message


def test_a_quoted_port_in_a_yaml_list_is_told_too(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('master_ports: [6000, "6001", 6002]\n')
    with pytest.raises(SettingsError, match=f'{UNQUOTED}: 6001, not "6001"'):
        load_settings(path)


def test_a_quoted_number_in_spec_yaml_is_told_to_drop_the_quotes(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text('name: x\naxes: L KV P T H D\npage_size: "16"\n')
    with pytest.raises(AdapterError, match=f'{UNQUOTED}: page_size: 16, not page_size: "16"'):
        load_spec(path)


@pytest.mark.parametrize(
    "text",
    [
        'page_size: "sixteen"\n',  # no number
        'page_size: "16.0"\n',  # a number, but no integer: unquoting it would not help
        'hybrid: "1"\n',  # not a number setting
        'page_size: "1_6"\n',  # the environment's reading refuses it as well
    ],
)
def test_quoted_text_that_is_no_number_for_its_key_gets_no_hint(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError) as caught:
        load_settings(path)
    assert UNQUOTED not in str(caught.value)


def test_the_hint_is_for_yaml_only():
    """The same text as an argument or a spec dict is no YAML: no hint; from the environment it is a number."""
    with pytest.raises(SettingsError) as caught:
        load_settings(page_size="16")
    assert "must be a positive integer, got '16'" in str(caught.value) and UNQUOTED not in str(caught.value)
    with pytest.raises(AdapterError) as spec:
        load_spec({"name": "x", "axes": "N H D", "page_size": "16"})
    assert UNQUOTED not in str(spec.value)
    with mock.patch.dict(os.environ, {f"{ENV_PREFIX}PAGE_SIZE": "16"}):
        assert load_settings().page_size == 16


@given(field=st.sampled_from(["ready_file", "lock_dir"]), relative=st.text(ALPHABET, min_size=1, max_size=20))
def test_a_validators_problem_reads_in_its_own_words_without_pydantics_prefix(field, relative):
    with pytest.raises(SettingsError) as caught:
        load_settings(**{field: relative})
    line = next(line for line in str(caught.value).splitlines() if line.strip().startswith(field))
    assert line.endswith("must be an absolute path: start_remote and the engine resolve a relative one against their "
                         "own working directories, which differ"), line  # fmt: skip
    assert "Value error" not in str(caught.value)


def test_a_type_error_keeps_pydantics_words():
    with pytest.raises(SettingsError) as caught:
        load_settings(sglang="perhaps")
    assert "sglang='perhaps' (from argument): Input should be a valid boolean" in str(caught.value), caught.value
