"""Stand-in for what FlexKV's vLLM connector imports (FlexKV cannot be built here), following FlexKV 34ab141.

The connector itself is FlexKV's real ``vllm_v1_adapter.py`` (tests/vllm/conftest.py loads it from
``tests.flexkv_source.find()`` into this package). What stands in: the config, whose
``FlexKVConfig`` derives the layout at construction by calling the attention backend's
``get_kv_cache_shape`` (absent from vLLM 0.33's backends: the crash the plugin fixes), the
``KVManager`` data plane (it copies blocks and can be told to fail), and ``KVTPClient``, whose
``register_to_server`` records every registration. ``flexkv.common`` is the shared layout
stand-in in ``tests/fake_flexkv``.
"""

from pathlib import Path

__path__.append(str(Path(__file__).parents[3] / "fake_flexkv" / "flexkv"))
