"""``flexkv.c_ext``'s hashing on CPU, written from FlexKV's csrc/hash.cpp and cache_utils.h (34ab141).

``HashType`` is ``XXH64_hash_t`` (8 bytes); ``Hasher`` wraps one streaming XXH64 state seeded 0;
``update`` feeds a 1-D tensor's raw bytes; ``gen_hashes`` feeds each block of ``tokens_per_block``
int64 token ids into the SAME state and digests after each, so block ``i``'s hash covers the whole
prefix up to it (the radix index relies on that). Needs the ``xxhash`` package (the same XXH64).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xxhash  # type: ignore[import-not-found]

HASH_SIZE = 8  # sizeof(XXH64_hash_t)


def get_hash_size() -> int:
    return HASH_SIZE


def _bytes(data: Any) -> bytes:
    array = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    assert array.ndim == 1, "Hasher.update takes a 1-D tensor (hash.cpp asserts input.ndim() == 1)"
    return np.ascontiguousarray(array).tobytes()


class Hasher:
    """``flexkv::Hasher``: XXH64 streaming state, ``reset`` reseeds with 0."""

    def __init__(self) -> None:
        self._state = xxhash.xxh64(seed=0)

    def reset(self) -> None:
        self._state.reset()

    def update(self, data: Any) -> Hasher:
        self._state.update(_bytes(data))
        return self

    def digest(self) -> int:
        return int(self._state.intdigest())


def gen_hashes(hasher: Hasher, token_ids: torch.Tensor, tokens_per_block: int, block_hashes: torch.Tensor) -> None:
    """One digest per block of the running prefix hash, written into ``block_hashes`` (uint64)."""
    assert token_ids.dtype == torch.int64 and token_ids.ndim == 1 and block_hashes.ndim == 1
    blocks = block_hashes.numel()
    assert token_ids.numel() // tokens_per_block == blocks
    ids = token_ids.numpy()
    out = block_hashes.numpy().view(np.uint64)
    for i in range(blocks):
        hasher.update(ids[i * tokens_per_block : (i + 1) * tokens_per_block])
        out[i] = hasher.digest()
