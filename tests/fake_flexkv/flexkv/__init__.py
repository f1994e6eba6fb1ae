"""Stand-in for FlexKV's pure-Python layout module (FlexKV cannot be installed here).

Only ``flexkv.common.storage`` is provided, following FlexKV 34ab141 (contract §1.1) exactly:
``KVCacheLayoutType`` and the ``KVCacheLayout`` dataclass with its fields and ``kv_shape``.
"""
