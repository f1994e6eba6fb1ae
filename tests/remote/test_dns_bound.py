"""start_remote's own name lookups of the master (preflight, lock key, spawn check, the master's ports)
end by connect_timeout_s, and a stop signal ends a hanging one within grace_s. The resolver that never
answers is a ``socket.getaddrinfo`` (and ``gethostbyname``) blocked on an Event, put into the real
start_remote process by a sitecustomize on its PYTHONPATH."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from flexkv_adapter.remote.children import descendants

from .harness import ROOT, Remote

HANG = "master.hangs-in-the-resolver.test"
CONNECT_S, GRACE_S = 1.0, 6.0
SLACK_S = 5.0  # a loaded machine's scheduling; without the bound the process never ends at all
SITECUSTOMIZE = '''
import os, socket, threading

_real_getaddrinfo, _real_gethostbyname = socket.getaddrinfo, socket.gethostbyname
_answer, _lock = int(os.environ["HANG_AFTER"]), threading.Lock()


def _ask(host):
    """Answer the first HANG_AFTER lookups of the name (loopback), then never again."""
    global _answer
    with _lock:
        _answer -= 1
        left = _answer
        with open(os.environ["HANG_MARK"], "a") as mark:
            mark.write("answered\\n" if left >= 0 else "hanging\\n")
    if left < 0:
        threading.Event().wait()


def getaddrinfo(host, port, *args, **kwargs):
    if host == os.environ["HANG_NAME"] and not kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
        _ask(host)
        return _real_getaddrinfo("127.0.0.1", port, *args, **kwargs)
    return _real_getaddrinfo(host, port, *args, **kwargs)


def gethostbyname(host):
    if host == os.environ["HANG_NAME"]:
        _ask(host)
        return "127.0.0.1"
    return _real_gethostbyname(host)


socket.getaddrinfo, socket.gethostbyname = getaddrinfo, gethostbyname
'''


def _start(tmp: Path, hang_after: int, connect_s: float) -> tuple[Remote, Path]:
    """start_remote whose resolver answers ``hang_after`` lookups of the master's name, then hangs."""
    tmp.mkdir()
    (tmp / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp / "lookups"
    env = {"PYTHONPATH": f"{tmp}:{ROOT}", "HANG_NAME": HANG, "HANG_AFTER": str(hang_after), "HANG_MARK": str(mark)}
    return Remote(tmp, env=env, master_host=HANG, connect_timeout=connect_s, grace=GRACE_S), mark


def _hanging_since(mark: Path, remote: Remote, timeout: float = 60) -> float:
    """When the resolver started hanging (the process's start-up, torch imports included, left out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mark.exists() and "hanging" in mark.read_text():
            remote.children = descendants(remote.proc.pid)  # checked for orphans after the exit
            return time.monotonic()
        assert remote.proc.poll() is None, remote.finish()
        time.sleep(0.02)
    raise AssertionError(f"the resolver was never asked a lookup it hangs on: {mark.read_text()}")


def _finish(remote: Remote, within: float) -> tuple[int | None, str]:
    """Exit status and stderr; None if the process outlived ``within`` s (then killed)."""
    try:
        code, _, err = remote.finish(timeout=within)
        return code, err
    except Exception:
        remote.proc.kill()
        return None, remote.proc.communicate()[1]


def test_a_master_lookup_that_never_answers_ends_start_remote_with_exit_10_by_connect_timeout(tmp_path):
    # 0: the preflight's lookup hangs; 1: the lock key's; 2: the spawn check's; 3: the master ports'
    remotes = {n: _start(tmp_path / f"after{n}", n, CONNECT_S) for n in range(4)}
    since = {n: _hanging_since(mark, remote) for n, (remote, mark) in remotes.items()}
    for n, (remote, _) in remotes.items():
        code, err = _finish(remote, CONNECT_S + GRACE_S + SLACK_S - (time.monotonic() - since[n]))
        took = time.monotonic() - since[n]
        assert code == 10, f"lookup #{n + 1} hanging: exit {code} after {took:.1f} s\n{err}"
        errors = [line for line in err.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and HANG in errors[0], errors
        assert "connect_timeout_s=1 s" in errors[0] or "within 1s" in errors[0], errors[0]
        assert took <= CONNECT_S + GRACE_S + SLACK_S
        assert "state: ready" not in err and remote.orphans() == []


def test_a_stop_signal_during_a_lookup_that_never_answers_exits_0_within_grace(tmp_path):
    # 0: the preflight's lookup hangs; 1: the lock key's, which ran on the main thread
    remotes = {n: _start(tmp_path / f"after{n}", n, 300) for n in range(2)}
    for remote, mark in remotes.values():
        _hanging_since(mark, remote)
    for n, (remote, _) in remotes.items():
        started = time.monotonic()
        remote.proc.send_signal(signal.SIGTERM)
        code, err = _finish(remote, GRACE_S + SLACK_S)
        took = time.monotonic() - started
        assert code == 0, f"lookup #{n + 1} hanging: exit {code} {took:.1f} s after SIGTERM\n{err}"
        assert time.monotonic() - started <= GRACE_S + SLACK_S
        assert "stopped before connecting to the master" in err and " ERROR " not in err
        assert remote.orphans() == []
