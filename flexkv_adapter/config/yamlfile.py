"""Read a small YAML file that a person wrote (settings, layout specs), safely.

Everything that can go wrong is an error of the caller's class naming the file: a path that is
not a regular file is refused from ``stat`` without being opened (a FIFO would block forever),
the size is bounded, the bytes must be UTF-8, only YAML's safe tags are constructed, and alias
expansion and nesting are bounded while the document is composed, so an alias bomb costs a few
kilobytes instead of gigabytes.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, cast

import yaml
from yaml.composer import ComposerError
from yaml.error import MarkedYAMLError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import AdapterError
from ..text import clip, short_repr
from .strict import number_text

MAX_BYTES = 256 << 10  # settings and specs are a few kilobytes; 256 KiB parse in about 0.1 s
MAX_NODES = 10_000  # composed nodes, counting every node an alias repeats
MAX_DEPTH = 64


_MERGE = "tag:yaml.org,2002:merge"


def _written_keys(node: MappingNode) -> list[tuple[tuple[str, str], Node]]:
    """Every key a mapping writes: its own, and those each merge key (``<<``) brings in; a key written twice,
    by a merge or not, is an error (PyYAML keeps one of them silently)."""
    written: list[tuple[tuple[str, str], Node]] = []
    merges = [(key, value) for key, value in node.value if isinstance(key, ScalarNode) and key.tag == _MERGE]
    if len(merges) > 1:
        raise ComposerError(None, None, "the merge key << appears twice in one mapping", merges[1][0].start_mark)
    for key, value in node.value:
        if isinstance(key, ScalarNode) and key.tag == _MERGE:
            for merged in value.value if isinstance(value, SequenceNode) else [value]:
                if isinstance(merged, MappingNode):
                    written += [(k, key) for k, _ in _written_keys(merged)]
        elif isinstance(key, ScalarNode):
            written.append(((key.tag, key.value), key))
    return written


def _refuse_duplicate_keys(node: MappingNode) -> None:
    """PyYAML keeps the last of two equal keys; a setting written twice is a mistake to report."""
    seen: set[tuple[str, str]] = set()
    for key, where in _written_keys(node):
        if key in seen:
            how = " (a merge key << writes its keys too)" if where.tag == _MERGE else ""
            raise ComposerError(
                None, None, f"key {clip(str(key[1]), 60)!r} appears twice in one mapping{how}", where.start_mark
            )
        seen.add(key)


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses alias expansion beyond ``MAX_NODES`` and nesting beyond ``MAX_DEPTH``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._weight: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._total = 0
        self._depth = 0

    def _count(self, n: int) -> None:
        self._total += n
        if self._total > MAX_NODES:
            raise ComposerError(
                None, None, f"the document expands to more than {MAX_NODES} nodes (alias expansion refused)"
            )

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor  # type: ignore[no-untyped-call]
            if anchor in self.anchors:
                weight = self._weight.get(id(self.anchors[anchor]))
                if weight is None:
                    raise ComposerError(None, None, f"alias *{clip(str(anchor), 40)} refers to a node that contains it")
                self._count(weight)
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"the document is nested more than {MAX_DEPTH} levels deep")
        node = cast(Node, super().compose_node(parent, index))  # type: ignore[no-untyped-call]
        self._depth -= 1
        weight = 1
        if isinstance(node, SequenceNode):
            weight += sum(self._weight[id(child)] for child in node.value)
        elif isinstance(node, MappingNode):
            weight += sum(self._weight[id(k)] + self._weight[id(v)] for k, v in node.value)
            _refuse_duplicate_keys(node)
        self._weight[id(node)] = weight
        self._count(1)
        return node


def _number_scalar(kind: str) -> Any:
    """A YAML number is text a person wrote, read by the environment's rule (:func:`.strict.number_text`):
    YAML 1.1 read ``020`` as 16 where the environment reads 20, and ``1_6``, ``0x10``, ``1:00`` as numbers the
    environment refuses; such text stays text, for the typed rule to refuse."""

    def construct(loader: yaml.SafeLoader, node: Node) -> object:
        return number_text(str(loader.construct_scalar(node)), kind)  # type: ignore[arg-type]

    return construct


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _number_scalar("int"))
BoundedLoader.add_constructor("tag:yaml.org,2002:float", _number_scalar("float"))
# YAML 1.1 wants a point and a signed exponent ("1e3", "1.5e1" stayed strings); the environment reads 1e3 as 1000.0
EXPONENT_FLOAT = re.compile(
    r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"
)  # a writer that wants "1e3" kept text must quote it
BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+.0123456789"))  # type: ignore[no-untyped-call]


def shown(path: object) -> str:
    """A path as messages show it (a path can be 4 KB long)."""
    return clip(str(path), 200)


def as_path(source: object, error: type[AdapterError], what: str) -> Path:
    """``source`` as a :class:`Path`, refusing non-paths and NUL bytes (``open`` would raise ValueError)."""
    if not isinstance(source, (str, os.PathLike)):
        raise error(f"{what} must be a path (str or os.PathLike), not {type(source).__name__}: {short_repr(source)}")
    try:
        text = os.fspath(source)
    except Exception as exc:  # a PathLike whose __fspath__ raises
        raise error(
            f"{what} {type(source).__name__} has no usable path: {type(exc).__name__}: {clip(str(exc))}"
        ) from None
    if not isinstance(text, str):
        raise error(f"{what} must be a text path, not {type(text).__name__}: {short_repr(text)}")
    if "\0" in text:
        raise error(f"{what} {short_repr(text)} contains a NUL byte, which no file name can")
    return Path(text)


def _read_bytes(path: Path, error: type[AdapterError], what: str) -> bytes:
    """The file's bytes, refusing anything but a regular file of at most ``MAX_BYTES``."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {shown(path)} is a directory, not a YAML file")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} {shown(path)} is not a regular file (a FIFO, socket or device); refusing to open it")
        if info.st_size > MAX_BYTES:
            raise error(f"{what} {shown(path)} is larger than {MAX_BYTES} bytes ({info.st_size}); refusing to read it")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # replaced since the stat above
                raise error(f"{what} {shown(path)} is not a regular file; refusing to read it")
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{what} {shown(path)} does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {what} {shown(path)}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{what} {shown(path)} is larger than {MAX_BYTES} bytes; refusing to read it")
    return data


def _problem(exc: yaml.YAMLError) -> str:
    """One line: where (line, column) and what, without PyYAML's multi-line snippet."""
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        return f"{where}{exc.problem or exc.context}{context}"
    return " ".join(str(exc).replace('"<unicode string>", ', "").split())


def read_yaml(source: object, error: type[AdapterError], what: str) -> tuple[Path, Any]:
    """Parse one YAML document from the file ``source``: ``(path, data)``; ``None`` for an empty file."""
    path = as_path(source, error, what)
    data = _read_bytes(path, error, what)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {shown(path)} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None
    try:
        loader = BoundedLoader(text)  # checks for unprintable characters at once
        try:
            return path, loader.get_single_data()  # type: ignore[no-untyped-call]
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise error(f"{what} {shown(path)} is invalid YAML: {clip(_problem(exc), 400)}") from None
    except Exception as exc:  # PyYAML's constructors on hostile scalars: int("9" * 5000), "!!float" -> IndexError
        raise error(f"{what} {shown(path)} is invalid: {type(exc).__name__}: {clip(str(exc), 300)}") from None


def read_yaml_mapping(source: object, error: type[AdapterError], what: str) -> tuple[Path, dict[str, Any]]:
    """:func:`read_yaml` for files whose top level must be a mapping with string keys (empty -> ``{}``)."""
    path, data = read_yaml(source, error, what)
    if data is None:
        return path, {}
    if not isinstance(data, dict):
        raise error(f"{what} {shown(path)} must be a YAML mapping of keys to values, got a {type(data).__name__}")
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise error(f"{what} {shown(path)}: every key must be a name (a string), got {short_repr(odd[0])}")
    return path, data
