"""Register a planned pool with FlexKV's server, with the bounded retry FlexKV's connector uses."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Protocol

from ..errors import AdapterError
from ..readers.containers import own_class
from ..readers.options import check_keywords
from ..text import short_repr
from .checks import readmit
from .groups import check_model_groups, registration
from .model import check_against_model_config
from .plan import FlexKVPlan, plan

logger = logging.getLogger(__name__)

# Raised by a client or FlexKV version that can never succeed: retrying them only delays the error
# (FlexKV's own connector retries everything, 360 x 1 s, so version skew blocks for 6 minutes).
PROGRAMMING_ERRORS = (
    TypeError,
    ValueError,
    AttributeError,
    LookupError,
    NameError,
    NotImplementedError,
    AssertionError,
)


class RegistersToServer(Protocol):
    """The part of FlexKV's ``KVTPClient`` that :func:`register` calls."""

    def register_to_server(
        self, kv_caches: list[Any], kv_layout: Any, override_device_id: int | None = None, **groups: Any
    ) -> Any: ...


def register(
    source: object,
    client: RegistersToServer,
    *,
    override_device_id: int | None = None,
    model_config: object = None,
    attempts: int = 360,
    interval_s: float = 1.0,
    **plan_options: Any,
) -> FlexKVPlan:
    """Plan ``source`` (a view, raw tensors or a :class:`FlexKVPlan`) and register it.

    Calls ``client.register_to_server(kv_caches, kv_layout, override_device_id=...)`` of FlexKV's
    ``KVTPClient``. Transient failures (socket/OS/runtime errors) are retried ``attempts`` times,
    ``interval_s`` apart, like FlexKV's SGLang connector (360 x 1 s); invalid input and
    programming errors (:data:`PROGRAMMING_ERRORS`: e.g. CPU tensors, a FlexKV version without an
    attribute) are raised at once, and so is a client without ``register_to_server`` or an invalid
    ``attempts``/``interval_s``/``override_device_id``. ``model_config`` (FlexKV's ``ModelConfig``)
    is checked against the layout before anything is sent. A pool offloaded whole (``plan.groups``)
    also sends ``layer_groups``, ``gpu_layouts`` and ``handles_per_group``, and its ``model_config``
    must carry exactly ``plan.flexkv_layer_groups()``; a single-group pool sends none, and its
    ``model_config`` must carry none. Returns the plan.
    """
    send = _register_method(client)
    _check_retry_options(attempts, interval_s, override_device_id)
    own_class(source, "register(source)")
    check_keywords(set(plan_options) - {"replicated_kv_heads"}, "register")
    if isinstance(source, FlexKVPlan):
        if plan_options:
            raise AdapterError(
                f"register() of a FlexKVPlan takes no plan options ({', '.join(sorted(plan_options))} would be "
                f"ignored: the plan is already made); pass them to plan(), or register the source instead"
            )
        readmit(source)  # its tensors, as they are now: a storage freed or swapped since planning is refused
        if model_config is not None:
            check_against_model_config(source, model_config)
        p = source
    else:
        p = plan(source, model_config=model_config, **plan_options)
    check_model_groups(p, model_config)
    layout = p.to_flexkv()
    kv_caches, groups = registration(p)
    for attempt in range(1, attempts + 1):
        try:
            send(kv_caches, layout, override_device_id=override_device_id, **groups)
        except PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            if attempt == attempts:
                raise AdapterError(f"FlexKV registration failed after {attempts} attempts: {exc}") from exc
            logger.warning("FlexKV registration attempt %d/%d failed: %s; retrying", attempt, attempts, exc)
            time.sleep(interval_s)
        else:
            logger.info("registered with FlexKV: %s", p)
            return p
    raise AssertionError("unreachable: attempts >= 1 was checked")


def _register_method(client: object) -> Any:
    try:
        method = getattr(client, "register_to_server", None)
    except Exception as exc:  # a property that raises is a broken client, not a transient failure
        raise AdapterError(f"reading {type(client).__name__}.register_to_server raised {exc!r}") from exc
    if not callable(method):
        raise AdapterError(
            f"{type(client).__name__} has no callable register_to_server; pass FlexKV's KVTPClient "
            f"(flexkv.server.client.KVTPClient) or an object with its register_to_server method"
        )
    return method


def _check_retry_options(attempts: object, interval_s: object, override_device_id: object) -> None:
    """Refuse what would only fail later (sleep(-1)) or never end; a bool is not a number."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise AdapterError(f"attempts must be a whole number >= 1, got {short_repr(attempts)}")
    if (
        isinstance(interval_s, bool)
        or not isinstance(interval_s, (int, float))
        or not math.isfinite(interval_s)
        or interval_s < 0
    ):
        raise AdapterError(f"interval_s must be a finite number of seconds >= 0, got {short_repr(interval_s)}")
    if override_device_id is not None and (
        isinstance(override_device_id, bool) or not isinstance(override_device_id, int) or override_device_id < 0
    ):
        raise AdapterError(
            f"override_device_id must be None or a device index >= 0, got {short_repr(override_device_id)}"
        )
