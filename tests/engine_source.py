"""Classes an installed engine defines, read from its source: what the feature-table completeness tests walk.

Reading the source finds classes in modules a machine cannot import (NPU, MLX) and classes defined inside
functions; each engine tier then imports the modules it found (a failure fails its test) to complete the set.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path


def subclasses_in_source(root: Path, package: str, bases: tuple[str, ...], line: str = r"") -> dict[str, str]:
    """Classes under ``root`` (the folder of ``package``) whose base chain reaches one of ``bases`` by name:
    name -> module. ``line``: a pattern a file's class line must match to be parsed (a fast filter)."""
    pattern = re.compile(rf"^\s*class \w+\({line}", re.MULTILINE)
    found_bases: dict[str, list[tuple[str, str]]] = {}
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if not pattern.search(text):
            continue
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                found_bases.setdefault(node.name, []).extend((module, b) for b in names)
    found, changed = dict.fromkeys(bases, ""), True
    while changed:
        changed = False
        for name, entries in found_bases.items():
            if name not in found and any(b in found for _, b in entries):
                found[name], changed = entries[0][0], True
    return {n: m for n, m in found.items() if n not in bases}
