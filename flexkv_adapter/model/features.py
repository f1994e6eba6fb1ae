"""What each engine feature gets from the adapter: served (proven), bypassed per request, or refused.

One :class:`FeatureTable` per engine (:mod:`.sglang_features`, :mod:`.vllm_features`) names every KV pool
class and KV cache spec type the engine defines (each engine tier's completeness test enumerates them), and
the options and request features that change the KV or the prefix cache. The table is the one place such a
feature is decided: a class or spec type it does not name is refused (default deny), by an error that names
it and points at the table, never served because nothing stopped it. Options are the rows listed; an option
the engine adds later is not judged until a row names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["served", "bypassed", "refused"]
VERDICTS: tuple[Verdict, ...] = ("served", "bypassed", "refused")


@dataclass(frozen=True)
class Feature:
    """One row: a feature as the engine spells it, and what the adapter does with it.

    ``reason`` reads after "<name> is" ("a HiSparse pool: ..."), so a refusal's message is one sentence.
    ``proof`` and ``control`` (served) are pytest node ids of the test on the engine's real code and of its
    negative control; ``where`` (refused) says when the refusal comes, ``reason`` why, ``instead`` what the
    user can do. ``nested``: a class that is served (or refused only for its own shape) may sit inside a
    served wrapper, where the wrapper's reading decides; a class refused for what its rows mean may not.
    """

    name: str
    kind: str  # "KV pool class", "server option", "KV cache spec", "request feature", ...
    verdict: Verdict
    reason: str
    proof: str = ""
    control: str = ""
    where: str = ""
    instead: str = ""
    nested: bool = False
    trigger: tuple[str, Any] | tuple[()] = ()  # (engine setting, a value that turns the feature on): what the tests set

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"{self.name}: verdict {self.verdict!r} is none of {VERDICTS}")
        if self.verdict == "served" and not (self.proof and self.control):
            raise ValueError(f"{self.name}: a served row names its proof and its negative control")
        if self.verdict == "refused" and not (self.where and self.instead):
            raise ValueError(f"{self.name}: a refused row says where it is refused and what to do instead")


@dataclass(frozen=True)
class FeatureTable:
    """An engine's rows, looked up by name; ``doc`` is where users read the table."""

    engine: str  # "SGLang 0.5.23"
    doc: str  # "docs/sglang.md#features"
    rows: tuple[Feature, ...]
    by_name: dict[str, Feature] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names: dict[str, Feature] = {}
        for row in self.rows:
            if row.name in names:
                raise ValueError(f"{self.engine}: {row.name} is classified twice")
            names[row.name] = row
        object.__setattr__(self, "by_name", names)

    def get(self, name: str) -> Feature | None:
        return self.by_name.get(name)

    def of_kind(self, kind: str) -> tuple[Feature, ...]:
        return tuple(r for r in self.rows if r.kind == kind)

    def refused_and_on(self, kind: str, read: Callable[[str], Any]) -> tuple[Feature, str, Any, Any] | None:
        """The first refused ``kind`` row whose trigger setting, read by ``read``, turns its feature on
        (:func:`turned_on`): (row, setting, value, the trigger's example), or None. The one loop every engine's
        option check runs."""
        for row in self.of_kind(kind):
            if row.verdict == "refused" and row.trigger:
                setting, example = row.trigger
                if turned_on(value := read(setting), example):
                    return row, setting, value, example
        return None

    def without(self, name: str) -> FeatureTable:
        """The table less one row: what the completeness tests' negative controls run against."""
        return FeatureTable(self.engine, self.doc, tuple(r for r in self.rows if r.name != name))

    def refusal(self, name: str, kind: str, where: str = "") -> str | None:
        """The error text for ``name`` (a ``kind``) if the table refuses it or does not name it, else None.
        ``where``: how the user's object reached it (``SWAKVPool.full_kv_pool``), prepended when given."""
        row = self.get(name)
        at = f"{where} ({name})" if where and where != name else name
        if row is None:
            return (
                f"{at} is a {kind} of {self.engine} that flexkv_adapter has not classified, so it is refused "
                f"(nothing proves that FlexKV would read its KV right). Every {kind} it serves, bypasses or "
                f"refuses is listed in {self.doc}"
            )
        if row.verdict != "refused":
            return None
        return f"{at} is {row.reason}. {row.instead} (refused: see {self.doc})"

    def markdown(self, kinds: Iterable[str] | None = None) -> str:
        """The table as docs show it, one section per kind (generated; tests keep the docs equal to it)."""
        wanted = list(dict.fromkeys(r.kind for r in self.rows)) if kinds is None else list(kinds)
        out: list[str] = []
        for kind in wanted:
            rows = sorted(self.of_kind(kind), key=lambda r: (VERDICTS.index(r.verdict), r.name))
            places = {r.where for r in rows if r.verdict == "refused"}
            out += [f"**{kind}**" + (f" (refused at {next(iter(places))})" if len(places) == 1 else ""), ""]
            out += ["| name | verdict | why | proof and negative control, or what to do instead |", "|---|---|---|---|"]
            for r in rows:
                if r.verdict == "refused":
                    detail = r.instead + (f" (refused at {r.where})" if len(places) > 1 else "")
                else:
                    detail = f"`{r.proof}`; control `{r.control}`"
                out.append(f"| `{r.name}` | {r.verdict} | {_cell(r.reason)} | {_cell(detail)} |")
            out.append("")
        return "\n".join(out).rstrip() + "\n"


def turned_on(value: Any, example: Any) -> bool:
    """Whether a setting's ``value`` turns its feature on, judged by the kind of value that does (the row's
    trigger example): a flag set (True), a size above 1 (an int), a name given (a str other than the spellings
    of none: "", "null", "none"), an object given (``object``: anything but None)."""
    if example is object:
        return value is not None
    if isinstance(example, bool):
        return value is True
    if isinstance(example, int):
        return isinstance(value, int) and not isinstance(value, bool) and value > 1
    return isinstance(value, str) and value.lower() not in ("", "null", "none")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_name(cls: type, prefixes: tuple[str, ...]) -> str:
    """The name a table knows ``cls`` by: its own name when the engine defines it, else its full path (a user's
    subclass of an engine class, or an object that is not the engine's at all: names no table holds)."""
    own = getattr(cls, "__module__", "") or ""
    return cls.__name__ if own.startswith(prefixes) else f"{own}.{cls.__qualname__}"


def engine_class(cls: type, prefixes: tuple[str, ...]) -> bool:
    """Whether ``cls`` is an engine class: one with a class from one of the engine's modules in its MRO."""
    return any(getattr(c, "__module__", "").startswith(prefixes) for c in getattr(cls, "__mro__", (cls,)))
