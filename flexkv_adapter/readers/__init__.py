"""Reading a pool: finding its tensors (containers, attributes, vLLM dicts, specs, plugins) and naming their axes."""
