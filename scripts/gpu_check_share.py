"""gpu_check part 2: share every view tensor with a second process as FlexKV does.

``torch.multiprocessing`` reductions (``reduce_tensor``, what FlexKV's ``TensorSharedHandle`` uses;
CUDA handles travel pickled, as over FlexKV's ZMQ socket); the second process rebuilds each tensor
and reports its bytes, offset inside the allocation, shape and strides.
"""

from __future__ import annotations

import hashlib
import pickle
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import reduce_tensor


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _child(conn: Any, cuda: bool) -> None:
    """The second process: rebuild every shared tensor and describe what it sees."""
    try:
        payload = conn.recv()
        handles = pickle.loads(payload) if cuda else payload
        seen = []
        for func, args in handles:
            t = func(*args)
            seen.append(
                {
                    "sha256": digest(t),
                    "offset": t.data_ptr() - t.untyped_storage().data_ptr(),
                    "ptr": t.data_ptr(),
                    "shape": list(t.shape),
                    "stride": list(t.stride()),
                }
            )
        conn.send(seen)
    except Exception:  # report, never hang the parent
        conn.send(traceback.format_exc())


def share_with_child(tensors: list[torch.Tensor], timeout_s: float) -> dict[str, Any]:
    """Send reduce_tensor() handles to a spawned process; compare bytes, offsets, shapes."""
    cuda = tensors[0].is_cuda
    handles = [reduce_tensor(t) for t in tensors]  # CPU tensors move to shared memory here
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, cuda), daemon=True)
    proc.start()
    parent.send(pickle.dumps(handles) if cuda else handles)
    if not parent.poll(timeout_s):
        proc.kill()
        return {"error": f"the second process did not answer within {timeout_s} s"}
    seen = parent.recv()
    proc.join(10)
    if isinstance(seen, str):
        return {"error": seen}
    mismatched = [
        i
        for i, (t, s) in enumerate(zip(tensors, seen))
        if s["sha256"] != digest(t)
        or s["offset"] != t.data_ptr() - t.untyped_storage().data_ptr()
        or s["shape"] != list(t.shape)
        or s["stride"] != list(t.stride())
    ]
    same_ptr = sum(s["ptr"] == t.data_ptr() for t, s in zip(tensors, seen))
    transport = "pickled CUDA IPC handles" if cuda else "torch.multiprocessing (shared memory)"
    return {"tensors": len(tensors), "mismatched": mismatched, "same_virtual_address": same_ptr, "transport": transport}
