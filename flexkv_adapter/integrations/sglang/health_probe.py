"""One bounded look at start_remote's health endpoint: a small HTTP/1.0 GET on a raw socket.

``urllib`` bounds each read, not the request: a port that trickles bytes, or sends one header
line at a time, keeps it waiting for ever, and a port that speaks something else (an SSH banner,
150 headers, a broken chunked body) raises ``http.client`` exceptions of its own. Here the whole
exchange (name lookup, connect, send, every read) ends by one deadline, at most ``MAX_HEAD`` and
``MAX_BODY`` bytes are read, and every failure is one :class:`ProbeFailed` with a readable reason.
start_remote's endpoint answers ``HTTP/1.0`` with a ``Content-Length`` and closes, so nothing more
is needed.
"""

from __future__ import annotations

import re
import socket
import time

from ...config import lookup

MAX_HEAD = 16 * 1024  # start_remote sends four header lines
MAX_BODY = 64 * 1024  # and a small JSON body
MAX_HEADERS = 32
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


class ProbeFailed(Exception):
    """Nothing usable answered: refused, timed out, or not start_remote's HTTP."""


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ProbeFailed("timed out")
    return left


def _receive(sock: socket.socket, deadline: float) -> bytes:
    data = bytearray()
    while True:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(16384)
        if not chunk:
            return bytes(data)
        data += chunk
        head, sep, body = bytes(data).partition(b"\r\n\r\n")
        if not sep and len(data) > MAX_HEAD:
            raise ProbeFailed(f"no end of headers within {MAX_HEAD} bytes: {bytes(data[:60])!r}")
        if sep and len(body) > MAX_BODY:
            raise ProbeFailed(f"answer longer than {MAX_BODY} bytes")
        if sep and (length := _content_length(head)) is not None and len(body) >= length:
            return bytes(data)  # complete, whether or not the peer closes


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip()) if value.strip().isdigit() else None
    return None


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """``socket.create_connection``, with the name lookup inside the same deadline as the connect."""
    error: OSError | None = None
    for family, kind, proto, _, address in lookup.getaddrinfo(host, port, _left(deadline)):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            return sock
        except OSError as exc:  # the next address, as create_connection does
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"{host!r} has no address")


def get(host: str, port: int, timeout_s: float) -> tuple[int, bytes]:
    """``GET /`` within ``timeout_s`` in all, the name lookup included: the status code and the body
    (at most ``MAX_BODY``)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    try:
        with _connect(_client_host(host), port, deadline) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = _receive(sock, deadline)
    except ProbeFailed:
        raise
    except lookup.LookupTimedOut as exc:
        raise ProbeFailed(str(exc)) from None
    except TimeoutError:
        raise ProbeFailed("timed out") from None
    except (OSError, UnicodeError, ValueError, OverflowError) as exc:  # refused, reset, a bad name
        raise ProbeFailed(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__) from None
    return _parse_http(data)


def _parse_http(data: bytes) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = _STATUS.fullmatch(lines[0])
    if status is None:
        raise ProbeFailed(f"not an HTTP answer: {data[:60]!r}")
    if not sep:
        raise ProbeFailed(f"answer ended inside its headers: {data[:60]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise ProbeFailed(f"{len(lines) - 1} header lines (start_remote sends four)")
    if any(b"chunked" in line.lower() for line in lines[1:] if line.lower().startswith(b"transfer-encoding")):
        raise ProbeFailed("a chunked answer (start_remote sends a Content-Length)")
    length = _content_length(head)
    if length is not None:
        if len(body) < length:
            raise ProbeFailed(f"answer cut short: {len(body)} of {length} body bytes")
        body = body[:length]
    return int(status.group(1)), body
