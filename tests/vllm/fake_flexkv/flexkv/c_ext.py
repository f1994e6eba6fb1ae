"""``flexkv.c_ext``'s hashing, as FlexKV's ``hash_utils.py`` calls it (csrc/hash.cpp, 34ab141): one streaming state
over raw bytes, ``gen_hashes`` digesting the running prefix after each block.

With ``xxhash`` installed it is ``tests/flexkv_cpu/hasher.py`` (XXH64, as FlexKV); else BLAKE2b-64. Either way
the bytes streamed, which decide what collides, are FlexKV's own: ``block.py`` and ``hash_utils.py`` are loaded
from the FlexKV tree (tests/vllm/conftest.py), so a namespace is hashed exactly as FlexKV hashes it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

try:
    from tests.flexkv_cpu.hasher import Hasher, gen_hashes, get_hash_size
except ImportError:  # no xxhash in this environment

    def get_hash_size() -> int:
        return 8

    class Hasher:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self._state = hashlib.blake2b(digest_size=8)

        def reset(self) -> None:
            self._state = hashlib.blake2b(digest_size=8)

        def update(self, data: Any) -> Any:
            array = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
            assert array.ndim == 1, "hash.cpp asserts input.ndim() == 1"
            self._state.update(np.ascontiguousarray(array).tobytes())
            return self

        def digest(self) -> int:
            return int.from_bytes(self._state.digest(), "little")

    def gen_hashes(hasher: Any, token_ids: Any, tokens_per_block: int, block_hashes: Any) -> None:  # type: ignore[misc]
        ids, out = token_ids.numpy(), block_hashes.numpy().view(np.uint64)
        for i in range(block_hashes.numel()):
            hasher.update(ids[i * tokens_per_block : (i + 1) * tokens_per_block])
            out[i] = hasher.digest()
