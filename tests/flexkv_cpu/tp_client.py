"""CPU stand-in for ``KVTPClient.register_to_server`` (flexkv/server/client.py, 34ab141).

FlexKV's own method refuses non-CUDA tensors (``client.py:381``) and wraps each tensor in a CUDA IPC
``TensorSharedHandle``. This subclass keeps FlexKV's client (its sockets, ids and every other method)
and builds the same ``RegisterTPClientRequest`` with :class:`CpuTensorHandle` in place of each CUDA IPC
handle, sent the same way. The SWA fields are passed through as FlexKV builds them.
"""

from __future__ import annotations

from typing import Any

import zmq

from .shared_tensor import CpuTensorHandle


def _groups(groups: Any) -> list[list[CpuTensorHandle]] | None:
    return [[CpuTensorHandle.of(t) for t in group] for group in groups] if groups else None


def cpu_client_class(real: type) -> type:
    """A subclass of FlexKV's ``KVTPClient`` whose registration shares CPU tensors."""
    from flexkv.server.request import RegisterTPClientRequest  # type: ignore[import-not-found]

    def register_to_server(self: Any, kv_caches: Any, kv_layout: Any, override_device_id: Any = None,
                           layer_groups: Any = None, gpu_layouts: Any = None, handles_per_group: Any = None,
                           swa_caches: Any = None, swa_layout: Any = None, swa_layer_groups: Any = None,
                           swa_gpu_layouts: Any = None, swa_handles_per_group: Any = None,
                           resume: bool = False) -> None:  # fmt: skip
        if not kv_caches:
            raise ValueError("GPU blocks must be CUDA tensors")  # FlexKV's check, less the device
        device_id = override_device_id if override_device_id is not None else self.device_id
        handles = [CpuTensorHandle.of(t) for t in kv_caches]
        per_group = _groups(handles_per_group)
        swa = [CpuTensorHandle.of(t) for t in swa_caches] if swa_caches else None
        swa_groups = _groups(swa_handles_per_group)
        req = RegisterTPClientRequest(
            dp_client_id=self.dp_client_id, pp_rank=self.pp_rank, intra_client_id=self.intra_client_id,
            device_id=device_id, handles=handles, gpu_layout=kv_layout, layer_groups=layer_groups,
            gpu_layouts=gpu_layouts, handles_per_group=per_group, swa_handles=swa, swa_layout=swa_layout,
            swa_layer_groups=swa_layer_groups, swa_gpu_layouts=swa_gpu_layouts, swa_handles_per_group=swa_groups,
        )  # fmt: skip
        if resume:
            self.gpu_control_socket.send_pyobj({"type": "resume_gpu", "registration": req})
            response = self.gpu_control_socket.recv_pyobj()
            if not response.get("ok"):
                raise RuntimeError(f"FlexKV GPU remap failed: {response.get('error')}")
        else:
            try:
                self.send_to_server.send_pyobj(req, flags=zmq.NOBLOCK)
            except zmq.Again:
                self.send_to_server.send_pyobj(req)
        self._exported_handles = handles + [h for g in per_group or [] for h in g]

    return type("KVTPClient", (real,), {"register_to_server": register_to_server, "__module__": real.__module__})
