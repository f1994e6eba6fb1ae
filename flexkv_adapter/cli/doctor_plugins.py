"""``doctor``'s plugin-selection rows: the value each engine will read, and the near misses that cost a failed start.

Each engine's rule is read as the engine applies it. SGLang splits ``SGLANG_PLUGINS`` on commas, strips the
names and, when any name is given, loads only the plugins it names (``FLEXKV_ADAPTER_SGLANG=1`` cannot bring
back a plugin the list leaves out); with none, it loads every plugin and ours acts on the opt-in. vLLM splits
``VLLM_PLUGINS`` on commas without stripping; unset, it loads every plugin. A name one slip away from the
plugin's (``flexkv-adapter``, the distribution's name; `` flexkv_adapter`` after a comma, for vLLM) is skipped
by the engine (SGLang says so only at INFO), so it is an error here, named with the fix; so is a variable one
slip away from the engine's (``SGLANG_PLUGIN``) whose value names the plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from ..config.problems import close_names
from ..integrations.sglang.plugin import OPT_IN_ENV, PLUGIN_NAME, opted_in

Row = tuple[str, Literal["ok", "warn", "error"], str]
VARIABLES = {"sglang": "SGLANG_PLUGINS", "vllm": "VLLM_PLUGINS"}
ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}
SKIPPED = {
    "sglang": "SGLang skips it, saying so only at INFO, and its in-tree connector fails at start after ~6 minutes",
    "vllm": "vLLM skips it without a word, and FlexKVConnectorV1 then fails at start",
}


def _names(engine: str, value: str) -> list[str]:
    """The plugin names ``value`` gives, split as the engine splits them."""
    if engine == "sglang":
        return [n.strip() for n in value.split(",") if n.strip()]
    return value.split(",")


def _near(name: str) -> bool:
    """``name`` is not the plugin's name but one slip away from it (a dash, a case, a letter, spaces)."""
    return name != PLUGIN_NAME and bool(close_names(name.strip(), [PLUGIN_NAME]))


def _why(name: str) -> str:
    if name.strip() == PLUGIN_NAME:
        return "vLLM keeps the spaces around a comma"
    if "-" in name:
        return f"the plugin is the entry point {PLUGIN_NAME}, with an underscore; flexkv-adapter is the distribution"
    return f"the plugin's name is {PLUGIN_NAME}, exactly"


def _fixed(names: list[str]) -> str:
    """The value that selects the plugin: each near miss corrected, else the plugin appended."""
    fixed = [PLUGIN_NAME if _near(n) else n.strip() for n in names if n.strip()]
    return ",".join(dict.fromkeys([*fixed, PLUGIN_NAME]))


def _misnamed(engine: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """Set variables one slip away from the engine's (``SGLANG_PLUGIN``, ``sglang_plugins``): name and value."""
    variable = VARIABLES[engine]
    return sorted((k, v) for k, v in environ.items() if k != variable and close_names(k, [variable]))


def _unread(engine: str, environ: Mapping[str, str], unset: str) -> Row | None:
    """The error row for a misnamed variable whose value names the plugin (or nearly), else None."""
    variable = VARIABLES[engine]
    for k, v in _misnamed(engine, environ):
        if any(n.strip() == PLUGIN_NAME or _near(n) for n in v.split(",")):
            fix = f"{k} -> {variable} ({ENGINES[engine]} reads only {variable}); set {variable}={_fixed(v.split(','))}"
            return (f"{engine} plugin", "error", f"not selected: {unset}, but {k}={v!r} is set: {fix}")
    return None


def _also(engine: str, environ: Mapping[str, str]) -> str:
    """A note on the misnamed variables the engine does not read."""
    return "".join(f"; {k}={v!r} is not read ({k} -> {VARIABLES[engine]}?)" for k, v in _misnamed(engine, environ))


def _near_miss(engine: str, shown: str, names: list[str]) -> Row | None:
    near = next((n for n in names if _near(n)), None)
    if near is None:
        return None
    fix = f"set {VARIABLES[engine]}={_fixed(names)}"
    detail = f"not selected: {shown}: {near!r} -> {PLUGIN_NAME!r} ({_why(near)}; {SKIPPED[engine]}); {fix}"
    return (f"{engine} plugin", "error", detail)


def sglang_selection(environ: Mapping[str, str]) -> Row:
    """Whether SGLang will load the plugin and the plugin act, with the value doctor found."""
    variable, row = VARIABLES["sglang"], "sglang plugin"
    value = environ.get(variable)
    names = _names("sglang", value or "")
    shown = f"{variable}={value!r}"
    if PLUGIN_NAME in names:
        return (row, "ok", f"selected ({shown})")
    if names:  # SGLang's allow-list: the opt-in cannot bring back a plugin it leaves out
        fix = f"set {variable}={_fixed(names)}"
        missed = f"not selected: {shown} leaves out {PLUGIN_NAME} (SGLang loads only the plugins it names); {fix}"
        return _near_miss("sglang", shown, names) or (row, "warn", missed + _also("sglang", environ))
    unset = f"{variable} is unset" if value is None else f"{shown} names no plugin"
    if opted_in(environ):
        return (row, "ok", f"selected ({OPT_IN_ENV}={environ.get(OPT_IN_ENV)!r}; {unset}: SGLang loads every plugin)")
    advice = f"not selected: {unset} and {OPT_IN_ENV} is not 1; set {variable}={PLUGIN_NAME} (or {OPT_IN_ENV}=1)"
    return _unread("sglang", environ, unset) or (row, "warn", advice + _also("sglang", environ))


def vllm_selection(environ: Mapping[str, str]) -> Row:
    """Whether vLLM will load the plugin, with the value doctor found (vLLM splits on commas, keeps spaces)."""
    variable, row = VARIABLES["vllm"], "vllm plugin"
    value = environ.get(variable)
    if value is None:
        return (row, "ok", f"selected ({variable} is unset: vLLM loads every plugin{_also('vllm', environ)})")
    names = _names("vllm", value)
    shown = f"{variable}={value!r}"
    if PLUGIN_NAME in names:
        return (row, "ok", f"selected ({shown})")
    missed = f"not selected: {shown} leaves out {PLUGIN_NAME}; set {variable}={_fixed(names)}"
    return _near_miss("vllm", shown, names) or (row, "warn", missed)
