"""``KVTPClient``: the worker's registration channel. Records instead of sending CUDA IPC handles."""

REGISTRATIONS: list[dict] = []
SUSPENDED = False  # between suspend_gpu_mappings and a resume registration (server/client.py:351-366)


class KVTPClient:
    def __init__(self, gpu_register_port, dp_client_id=0, pp_rank=0, intra_client_id=0, device_id=0):
        self.device_id = device_id

    def register_to_server(
        self,
        kv_caches,
        kv_layout,
        override_device_id=None,
        layer_groups=None,
        gpu_layouts=None,
        handles_per_group=None,
        resume=False,
        **swa,
    ):
        global SUSPENDED
        if not kv_caches:
            raise ValueError("GPU blocks must be CUDA tensors")
        SUSPENDED = False
        REGISTRATIONS.append(
            dict(
                kv_caches=list(kv_caches),
                kv_layout=kv_layout,
                resume=resume,
                layer_groups=layer_groups,
                gpu_layouts=gpu_layouts,
                handles_per_group=handles_per_group,
                device_id=override_device_id or self.device_id,
            )
        )

    def suspend_gpu_mappings(self):
        global SUSPENDED
        SUSPENDED = True
        return len(REGISTRATIONS[-1]["kv_caches"]) if REGISTRATIONS else 0
