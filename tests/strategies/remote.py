"""Hypothesis strategies for start_remote's and the engine's settings: ipc endpoints, hostile and plain."""

from __future__ import annotations

from hypothesis import strategies as st

# printable, no control characters (those are refused for another reason), short enough for a unix socket
_NAME = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/@"), min_size=1, max_size=12)
_REST = st.lists(st.one_of(_NAME, st.just("."), st.just("..")), min_size=0, max_size=3).map("/".join)


@st.composite
def relative_ipc_endpoints(draw: st.DrawFn) -> str:
    """``ipc://`` followed by anything but ``/`` or ``@`` first: ``ipc://x``, ``ipc://./x``, ``ipc://~/x``, ``ipc://``."""
    first = draw(st.one_of(_NAME, st.sampled_from([".", "..", "~", "", " /tmp"])))
    rest = draw(_REST)
    return f"ipc://{first}/{rest}" if rest and first else f"ipc://{first}"


@st.composite
def absolute_ipc_endpoints(draw: st.DrawFn) -> str:
    """An absolute path or an abstract name (``@name``), both short enough for FlexKV's derived names."""
    start = draw(st.sampled_from(["/", "@", "/tmp/", "//"]))
    last = draw(_NAME.filter(lambda n: n not in (".", "..")))  # a socket's own name, not a directory's
    return f"ipc://{start}{draw(_REST)}/{last}".replace("@/", "@", 1)


def values_outside(low: float, high: float) -> st.SearchStrategy[object]:
    """What a duration setting bounded to [low, high] must refuse: numbers beyond either end, NaN and
    infinities, booleans, and strings that are no number."""
    return st.one_of(
        st.floats(max_value=low, exclude_max=True, allow_nan=False).filter(lambda v: v < low),  # not -0.0
        st.floats(min_value=high, exclude_min=True),
        st.sampled_from([float("nan"), float("inf"), float("-inf"), True, False, "soon", "", "1e400", "None"]),
    )


@st.composite
def ipc_endpoints_naming_no_socket(draw: st.DrawFn) -> str:
    """Absolute ipc paths that name a directory (``ipc:///``, a trailing ``/``, a last ``.`` or ``..``) and the
    empty abstract name ``ipc://@``: ZMQ refuses each only when FlexKV's server binds it (EADDRINUSE, EINVAL),
    though FlexKV's derived ``<path>_gpu_register`` would bind."""
    if draw(st.booleans()):
        return "ipc://@"
    last = draw(st.sampled_from(["", ".", ".."]))
    return f"ipc://{draw(st.sampled_from(['/', '/tmp/', '//']))}{draw(_REST)}/{last}"
