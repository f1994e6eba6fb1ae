"""Every read of a pool: sources, guarded attributes and containers, readings, hybrid wrappers, planes, specs, vLLM."""
