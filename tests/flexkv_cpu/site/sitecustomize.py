"""Start-up hook of every interpreter of a CPU engine run: FlexKV's compiled/CUDA parts replaced (boot.py)."""

import os

if os.environ.get("FLEXKV_CPU") == "1":
    from tests.flexkv_cpu.boot import install

    install()
