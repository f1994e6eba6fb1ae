"""Engine drop-ins: plugins that put :func:`~flexkv_adapter.adapt` in front of FlexKV's connectors.

One module per engine (``sglang``, ``vllm``), each a no-op when its engine or FlexKV is absent;
:mod:`.external_remote` serves every engine that lets FlexKV spawn its remote transfer process.
"""
