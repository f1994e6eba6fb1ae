"""FlexKV's compiled and CUDA parts on CPU, the only FlexKV code the tests replace (listed in README.md here)."""
