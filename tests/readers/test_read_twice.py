"""adapt()/plan(): identity by reading twice, when the second read changes memory.

A getter that shrinks (or frees) the storage while it is read a second time left the first read's views
reaching past their storage; adapt() then said "internal error ... please report". Read twice, the first
views must still lie inside their storage: NotAddressableError, naming the change.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import NotAddressableError, adapt
from flexkv_adapter.flexkv import plan

from ..helpers import distinct


class Shrinking:
    """``k_buffer`` resizes its storage on the ``on``-th read (0: never), returning the same tensor."""

    def __init__(self, on: int, same_list: bool, nbytes: int = 64) -> None:
        self.reads, self.on, self.nbytes = 0, on, nbytes
        self.k, self.v = distinct((32, 2, 4)), distinct((32, 2, 4), start=500)
        self.k_list, self.same_list, self.page_size = [self.k], same_list, 16

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        self.reads += 1
        if self.reads == self.on:
            self.k.untyped_storage().resize_(self.nbytes)
        return self.k_list if self.same_list else [self.k]

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        return [self.v]


@pytest.mark.parametrize("same_list", [True, False], ids=["same-list", "new-list"])
def test_a_storage_shrunk_between_two_reads_is_refused(same_list):
    for make in (
        lambda: Shrinking(2, same_list),
        lambda: SimpleNamespace(inner=Shrinking(2, same_list)),
    ):
        pool = make()
        attrs = ["inner.k_buffer", "inner.v_buffer"] if isinstance(pool, SimpleNamespace) else None
        with pytest.raises(NotAddressableError, match="changed between two reads"):
            adapt(pool, attrs=attrs, page_size=16)
    with pytest.raises(NotAddressableError, match="changed between two reads"):
        plan(Shrinking(2, same_list))
    # controls: never resized, or grown (storage moved, the views follow it) adapt and alias the pool
    for pool in (Shrinking(0, same_list), Shrinking(2, same_list, nbytes=4096)):
        view = adapt(pool)
        assert view.k_buffer[0].data_ptr() == pool.k.data_ptr()
        view.k_buffer[0].view(-1)[5] = 1234.0
        assert pool.k.view(-1)[5].item() == 1234.0
