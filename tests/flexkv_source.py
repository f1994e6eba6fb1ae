"""Where the tests find FlexKV's own Python: one rule for every tier.

FlexKV is not on the package registries. Its Python (connectors, KVManager, task and cache
engines, transfer worker, server) is looked for in this order:

1. ``FLEXKV_SOURCE``: a FlexKV checkout (the folder holding ``flexkv/``). Set but wrong is an
   error, never a silent fall-back to another copy.
2. An installed ``flexkv`` package (a real build, e.g. ``pip install -e`` of a checkout).
3. ``../shared/flexkv-34ab141`` beside this repository (every developer's and CI's copy).

``python -m tests.flexkv_source`` prints the one found (``FLEXKV_SOURCE=...`` for a shell to
export) or says how to point at one; ``scripts/test.sh`` puts that line in its summary.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "flexkv-34ab141"
HOW_TO = (
    "point FLEXKV_SOURCE at a FlexKV checkout (the folder holding flexkv/, e.g. "
    "git clone https://github.com/taco-project/FlexKV), or put shared/flexkv-34ab141 beside the repository"
)


class FlexKVSourceError(RuntimeError):
    """FLEXKV_SOURCE names something that is not a FlexKV source tree."""


@dataclass(frozen=True)
class Found:
    """The FlexKV source tree the tests use (``root`` holds ``flexkv/``), or why there is none."""

    root: Path | None
    how: str

    @property
    def skip_reason(self) -> str:
        return "" if self.root else f"FlexKV's Python was not found ({self.how}); {HOW_TO}"

    def summary(self) -> str:
        return f"{self.root} ({self.how})" if self.root else f"not found: tests that need it skip; {HOW_TO}"


def _is_tree(root: Path) -> bool:
    return (root / "flexkv" / "__init__.py").is_file() and (root / "flexkv" / "kvmanager.py").is_file()


def _installed() -> Path | None:
    """An importable ``flexkv`` that is not one of this repository's test stand-ins."""
    if "flexkv" in sys.modules:  # a stand-in may be loaded: ask the module's file, not the finder
        origin = getattr(sys.modules["flexkv"], "__file__", None)
    else:
        try:
            spec = importlib.util.find_spec("flexkv")
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec else None
    if not origin:
        return None
    root = Path(origin).resolve().parent.parent
    return root if _is_tree(root) and not root.is_relative_to(REPO / "tests") else None


def find() -> Found:
    """The first of FLEXKV_SOURCE, an installed flexkv, ../shared/flexkv-34ab141."""
    given = os.environ.get("FLEXKV_SOURCE", "")
    if given:
        root = Path(given).expanduser().resolve()
        if not _is_tree(root):
            raise FlexKVSourceError(f"FLEXKV_SOURCE={given!r} holds no flexkv/__init__.py and flexkv/kvmanager.py")
        return Found(root, "FLEXKV_SOURCE")
    installed = _installed()
    if installed is not None:
        return Found(installed, "installed flexkv")
    if _is_tree(SHARED):
        return Found(SHARED.resolve(), "shared copy beside the repository")
    return Found(None, "FLEXKV_SOURCE unset, no installed flexkv, no ../shared/flexkv-34ab141")


def main() -> int:
    try:
        found = find()
    except FlexKVSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"FLEXKV_SOURCE={found.root}" if found.root else "FLEXKV_SOURCE=")
    print(f"# {found.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
