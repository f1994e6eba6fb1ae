"""The vLLM versions the plugin was proven on, and the one rule that reads a version string against them.

The plugin's gate (:func:`.lifecycle.vllm_mismatch`, at ``FlexKVConnectorV1``'s construction) and ``doctor``
(:mod:`flexkv_adapter.cli.doctor_engines`) both ask :func:`version_problem`, so they cannot disagree. A minor
release is added only once the vLLM tier (``tests/vllm``) passes on it: a new vLLM may move a line a wrapper
answers without changing a signature the plugin checks.
"""

from __future__ import annotations

import re

PROVEN = ((0, 32), (0, 33), (0, 34))  # vLLM minor versions the wrappers were proven on (tests/vllm on each)
PROVEN_TEXT = "vLLM 0.32, 0.33 and 0.34"


def version_problem(version: str) -> str | None:
    """Why a vLLM version string is outside :data:`PROVEN`, or None (``0.33.1``, ``0.32.0+cpu`` are in)."""
    match = re.match(r"(\d+)\.(\d+)(?!\d)", version)
    if match is None:
        return f"vLLM's version {version!r} is not a version the plugin can read (it was proven on {PROVEN_TEXT})"
    if (int(match[1]), int(match[2])) not in PROVEN:
        return f"vLLM {version} is outside the range the plugin was proven on ({PROVEN_TEXT})"
    return None


__all__ = ["PROVEN", "PROVEN_TEXT", "version_problem"]
