"""The package's stages stand in one order: no module imports one from a stage above its own, not even
lazily inside a function, and no modules import each other in a circle (docs/architecture.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flexkv_adapter"
# Bottom-up; stages on one rank may not import each other either.
RANKS = {
    "errors": 0,
    "text": 0,
    "config": 1,
    "model": 2,
    "readers": 3,
    "gate": 4,
    "pipeline": 5,
    "flexkv": 6,
    "integrations": 7,
    "remote": 7,
    "cli": 8,
    "__main__": 9,
}
FACE = "flexkv_adapter"  # __init__.py: __version__ and lazy re-exports only; importing nothing, it ranks nowhere


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str:
    return module.split(".")[1] if "." in module else FACE


def imports(path: Path, modules: set[str]) -> Iterator[tuple[str, int, bool]]:
    """(imported module of the package, line, whether at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    here = _name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != here:
                yield target, node.lineno, id(node) in top


def upward(module: str, target: str) -> bool:
    if FACE in (_stage(module), _stage(target)):
        return False
    mine, theirs = _stage(module), _stage(target)
    return RANKS[theirs] > RANKS[mine] or (RANKS[theirs] == RANKS[mine] and theirs != mine)


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_name(p) for p in paths}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    wrong = []
    for path in paths:
        for target, line, at_top in imports(path, modules):
            if upward(_name(path), target):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
            if at_top:
                graph[_name(path)].add(target)
    return graph, wrong


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], dict.fromkeys(graph, 0)

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif state[nxt] == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node, [node])
    return found


def test_every_stage_is_ranked() -> None:
    assert {_stage(_name(p)) for p in PACKAGE.rglob("*.py")} - {FACE} <= set(RANKS)


def test_no_module_imports_a_stage_above_its_own() -> None:
    assert _graph()[1] == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(_graph()[0]) == []


@pytest.mark.parametrize(
    ("module", "target", "wrong"),
    [
        ("flexkv_adapter.readers.containers", "flexkv_adapter.pipeline.metadata", True),  # up
        ("flexkv_adapter.integrations.vllm", "flexkv_adapter.remote.lock", True),  # sideways, one rank
        ("flexkv_adapter.pipeline.build", "flexkv_adapter.gate", False),
        ("flexkv_adapter.readers.recognize", "flexkv_adapter.readers.containers", False),
    ],
)
def test_the_rank_check_tells_up_from_down(module: str, target: str, wrong: bool) -> None:
    assert upward(module, target) is wrong


def test_the_circle_check_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
