"""The CPU data plane's own counters and control flag, shared by every process of a run through one folder.

``$FLEXKV_CPU_STATE_DIR`` holds ``counters-<pid>.json`` (what each copying process, i.e. each FlexKV
transfer worker, has copied: calls and blocks each way, blocks perturbed) and, while a negative control
runs, the file ``perturb``. Read by the engine driver without importing FlexKV.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

COUNTERS = {"h2d_calls": 0, "h2d_blocks": 0, "d2h_calls": 0, "d2h_blocks": 0, "perturbed_blocks": 0}


def state_dir() -> Path | None:
    value = os.environ.get("FLEXKV_CPU_STATE_DIR")
    return Path(value) if value else None


def perturbing() -> bool:
    state = state_dir()
    return state is not None and (state / "perturb").exists()


def count(h2d: bool, blocks: int) -> None:
    side = "h2d" if h2d else "d2h"
    COUNTERS[f"{side}_calls"] += 1
    COUNTERS[f"{side}_blocks"] += blocks
    state = state_dir()
    if state is not None:
        out = state / f"counters-{os.getpid()}.json"
        out.with_suffix(".tmp").write_text(json.dumps(COUNTERS))
        out.with_suffix(".tmp").replace(out)


def read_counters(state: Path) -> dict[str, int]:
    """The counters summed over every process that copied."""
    total = dict.fromkeys(COUNTERS, 0)
    for path in state.glob("counters-*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] = total.get(key, 0) + int(value)
    return total
