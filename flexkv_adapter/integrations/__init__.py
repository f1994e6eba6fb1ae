"""Engine drop-ins: plugins that put :func:`~flexkv_adapter.adapt` in front of FlexKV's connectors.

One package per engine (:mod:`.sglang`, :mod:`.vllm`), each holding its plugin and every module only that
plugin uses; each plugin is a no-op when its engine or FlexKV is absent.
"""
