"""Stand-in for FlexKV's vLLM integration (FlexKV cannot be installed here), following FlexKV 34ab141.

It reproduces what matters to the adapter: ``FlexKVConnectorV1Impl`` derives its layout at
construction by calling the attention backend's ``get_kv_cache_shape`` (absent from vLLM 0.33's
backends: the crash the plugin fixes), the worker connector guesses the layout from the first
tensor's shape, and ``KVTPClient.register_to_server`` records every registration. ``flexkv.common``
is the shared layout stand-in in ``tests/fake_flexkv``.
"""

from pathlib import Path

__path__.append(str(Path(__file__).parents[3] / "fake_flexkv" / "flexkv"))
