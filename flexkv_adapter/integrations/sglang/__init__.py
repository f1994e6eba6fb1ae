"""The SGLang drop-in (:mod:`.plugin`) and everything only it uses.

``install`` is the entry point (group ``sglang.srt.plugins``); it imports the plugin when SGLang calls
it, so importing this package costs nothing. ``FEATURES`` is SGLang's feature table (every pool class,
option and request feature: served, bypassed or refused; docs/sglang.md#features), where a reader starts.
"""

from __future__ import annotations

from ...model.sglang_features import SGLANG as FEATURES


def install() -> None:
    """Entry point: :func:`.plugin.install` (imported on the call)."""
    from .plugin import install as install_plugin

    install_plugin()


__all__ = ["FEATURES", "install"]
