"""Hybrid pools: full/SWA/mamba sub-pools, their layer-id maps, and the planes stored beside the KV."""
