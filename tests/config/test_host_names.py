"""``master_host`` and ``health_host`` the resolver can never take are refused at load, on every way in.

Python's resolver encodes a host name as IDNA: ``a..b``, a label over 63 characters or a lone surrogate
fails there on every attempt. The engine then retried until ``remote_wait_s`` ran out, and only then
said the master was unreachable.
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexkv_adapter.config.settings import load_settings
from flexkv_adapter.errors import SettingsError

BAD = ["a..b", "a" * 64 + ".example", ".lead", "x\udcff.example"]
GOOD = ["10.0.0.1", "node0", "node-0.cluster.local", "ex\u00e4mple.com", "::1", "a" * 63 + ".example"]


def _resolver_refuses(name: str) -> bool:
    try:
        socket.getaddrinfo(name, 1, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except UnicodeError:
        return True
    except (OSError, ValueError):
        return False  # not numeric, or refused for another reason: the encoding was taken
    return False


@pytest.mark.parametrize("name", BAD)
def test_the_bad_names_are_ones_the_resolver_refuses_by_encoding(name):
    assert _resolver_refuses(name)


@pytest.mark.parametrize("key", ["master_host", "health_host"])
@pytest.mark.parametrize("name", BAD)
def test_a_name_the_resolver_cannot_take_is_refused_as_an_argument_and_in_the_environment(monkeypatch, key, name):
    with pytest.raises(SettingsError, match="not a host name the resolver can take") as caught:
        load_settings(None, **{key: name})
    assert key in caught.value.keys
    if "\udcff" not in name:  # the environment cannot hold a lone surrogate
        monkeypatch.setenv(f"FLEXKV_ADAPTER_{key.upper()}", name)
        with pytest.raises(SettingsError, match="not a host name the resolver can take"):
            load_settings(None)


@pytest.mark.parametrize("name", GOOD)
def test_good_names_and_addresses_load(name):
    assert load_settings(None, health_host=name).health_host == name


@settings(max_examples=80, deadline=None)
@given(name=st.text(alphabet="ab.-\u00e4", min_size=1, max_size=80))
def test_refused_exactly_when_the_resolver_refuses_the_encoding(name):
    try:
        load_settings(None, health_host=name)
        accepted = True
    except SettingsError:
        accepted = False
    assert accepted != _resolver_refuses(name)
