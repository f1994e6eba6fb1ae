"""The SGLang bridge's quarantine gives slots back as SGLang handed them: same device, same dtype, a copy."""

from __future__ import annotations

import torch

from flexkv_adapter.integrations.sglang_outcomes import Agreement, Quarantine


class _Allocator:
    def __init__(self) -> None:
        self.freed: list[torch.Tensor] = []

    def free(self, free_index: torch.Tensor) -> None:
        self.freed.append(free_index)


class _Manager:
    def __init__(self) -> None:
        self.ended: set[int] = set()

    def try_wait(self, tids: list[int]) -> dict[int, object]:
        return {t: type("Response", (), {"status": "success"})() for t in tids if t in self.ended}


def test_quarantined_slots_are_freed_in_the_allocators_dtype_and_device_once_flexkv_ends():
    quarantine, allocator, manager = Quarantine(Agreement(None, False)), _Allocator(), _Manager()
    slots = torch.tensor([7, 8, 9], dtype=torch.int32)
    quarantine.add(5, slots)
    slots.fill_(0)  # SGLang reuses its tensor: the quarantine kept its own copy
    with quarantine.withholding(allocator):
        allocator.free(torch.tensor([1, 7, 8, 9], dtype=torch.int32))
    assert [t.tolist() for t in allocator.freed] == [[1]]  # the quarantined ones withheld
    assert quarantine.poll(manager, leader=True) == 0 and len(quarantine) == 1  # FlexKV still copying
    manager.ended.add(5)
    assert quarantine.poll(manager, leader=True) == 1 and len(quarantine) == 0
    given_back = allocator.freed[-1]
    # SGLang's allocators concatenate what free() gets with their free lists on the KV device:
    # a CPU int64 copy of CUDA int32 slots made torch.cat raise in the scheduler loop
    assert (given_back.dtype, given_back.device, given_back.tolist()) == (torch.int32, slots.device, [7, 8, 9])
