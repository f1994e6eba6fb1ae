"""NOT vLLM: the one name SGLang's CPU engine imports from it, for the SGLang end-to-end run only.

SGLang 0.5.23's ``RotaryEmbedding.__init__`` (``layers/rotary_embedding/base.py:138``) imports
``vllm._custom_ops.rotary_embedding`` on a device that is neither CUDA, HIP, XPU, NPU, MUSA nor its
sgl-kernel CPU engine, and keeps it as a fallback the torch-native CPU path never calls. vLLM's Python
is 877 MB, past the environments' 12 GB budget, so this folder (on ``PYTHONPATH`` of the SGLang engine
run only, never installed) provides that name, and raises if it is ever called.
"""
