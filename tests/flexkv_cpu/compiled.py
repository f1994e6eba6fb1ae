"""FlexKV's own compiled ``flexkv.c_ext`` (scripts/install_flexkv.sh), where the FlexKV tree in use has one.

The first FlexKV tree on the path decides, as it does for Python's import: a tree holding a compiled
``flexkv/c_ext*.so`` is served by it (a load that fails is an error, never a silent stand-in); a tree of
Python alone (``../shared/flexkv-34ab141``) gets the stand-ins of :mod:`tests.flexkv_cpu.c_ext`.
Only what needs a GPU is replaced on top of the compiled module (:data:`GPU_ONLY`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable
from pathlib import Path

# csrc/bindings.cpp names that need a CUDA driver: TPTransferThreadGroup raises "CUDA driver version is
# insufficient" when built, LayerwiseTransferGroup segfaults (csrc/layerwise.cpp:578 leaves
# cudaMallocHost unchecked); transfer_kv_blocks is the GPU copy kernel (its stand-in: kernel.py)
GPU_ONLY = ("transfer_kv_blocks", "TPTransferThreadGroup", "LayerwiseTransferGroup")


def compiled_ext(roots: Iterable[str] | None = None) -> Path | None:
    """The compiled ``c_ext`` of the first FlexKV tree among ``roots`` (default: ``sys.path``), or None."""
    for root in sys.path if roots is None else roots:
        package = Path(root or ".") / "flexkv"
        if (package / "__init__.py").is_file():  # the suffixes this interpreter loads, in import's order
            found = [package / f"c_ext{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
            return next((f for f in found if f.is_file()), None)
    return None


def load(path: Path) -> types.ModuleType:
    """The compiled module itself (pybind11 3 uses multi-phase init: ``exec_module`` must follow). An extension
    is loaded once per process: every call gives the same module, and what is set on it stays."""
    import torch  # c_ext links torch's libraries, loaded by importing torch

    spec = importlib.util.spec_from_file_location("flexkv.c_ext", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a loadable extension module")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:  # most often: built for another torch (a CUDA build; this one is CPU-only)
        info = path.parent.parent / "BUILD_INFO"
        built = info.read_text().strip() if info.is_file() else "unknown"
        raise ImportError(
            f"FlexKV's compiled extension {path} does not load under torch {torch.__version__} ({exc}); it was "
            f"built as: {built}. Put a FlexKV tree without c_ext.so first on the path for the stand-ins"
        ) from exc
    return module
