"""The vLLM drop-in (:mod:`.plugin`) with its request lifecycle (:mod:`.lifecycle`, :mod:`.ledger`) and
stats (:mod:`.stats`).

``install`` is the entry point (group ``vllm.general_plugins``); it imports the plugin when vLLM calls
it, so importing this package costs nothing. ``FEATURES`` is vLLM's feature table (every KV cache spec type,
option and request feature: served, bypassed or refused; docs/vllm.md#features), where a reader starts.
"""

from __future__ import annotations

import logging

from ...model.vllm_features import VLLM as FEATURES


def install() -> None:
    """Entry point: :func:`.plugin.install` (imported on the call; never raises)."""
    try:
        from .plugin import install as install_plugin
    except Exception as exc:  # vLLM calls plugins without a try: a broken import must not stop the engine
        logging.getLogger(__name__).debug("flexkv_adapter vLLM plugin not installed: %s", exc)
        return
    install_plugin()


__all__ = ["FEATURES", "install"]
