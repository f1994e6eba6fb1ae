"""The command line's parser: an unknown command or flag gets the did-you-mean every other input gets.

One class for the parser and its subcommands' parsers (argparse builds those with the parent's class).
Its ``error`` is the one place a suggestion is added, from :func:`~flexkv_adapter.config.problems.did_you_mean`:
``flexkv-adapter doctr`` -> ``doctor``, ``demo --jsn`` -> ``--json``. A subcommand's parser reports its own
unknown flags (argparse would pass them up to the top parser, which knows only its own), so the suggestion
comes from that command's flags and the usage shown is that command's.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from ..config.problems import did_you_mean

_CHOICE = re.compile(r"invalid choice: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_UNKNOWN = "unrecognized arguments: "


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors suggest the nearest command or flag."""

    is_command = False  # a subcommand's parser: it reports its unknown flags itself

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.is_command:  # this command's flags, this command's usage
            self.error(_UNKNOWN + " ".join(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        super().error(suggest(message, self._actions))


def suggest(message: str, actions: Sequence[argparse.Action]) -> str:
    """argparse's ``message`` with a did-you-mean after each unknown command or flag that is near a known one."""
    if message.startswith(_UNKNOWN):
        flags = [o for action in actions for o in action.option_strings if o.startswith("--")]
        words = message[len(_UNKNOWN) :].split()
        hinted = [
            w + (did_you_mean(w.split("=", 1)[0], flags, prefix="--") if w.startswith("--") else "") for w in words
        ]
        return _UNKNOWN + " ".join(hinted)
    found = _CHOICE.search(message)
    if found is None:
        return message
    value: Any = ast.literal_eval(found.group(1))
    choices = [str(c) for action in actions if action.choices is not None for c in action.choices]
    hint = did_you_mean(str(value), choices) if isinstance(value, str) else ""
    return message[: found.end()] + hint + message[found.end() :]
