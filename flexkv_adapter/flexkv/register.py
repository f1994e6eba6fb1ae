"""Register a planned pool with FlexKV's server, with the bounded retry FlexKV's connector uses."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from ..errors import AdapterError
from .model import check_against_model_config
from .plan import FlexKVPlan, plan

logger = logging.getLogger(__name__)


class RegistersToServer(Protocol):
    """The part of FlexKV's ``KVTPClient`` that :func:`register` calls."""

    def register_to_server(
        self, kv_caches: list[Any], kv_layout: Any, override_device_id: int | None = None
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
    ``interval_s`` apart, like FlexKV's SGLang connector (360 x 1 s); invalid input
    (``ValueError``/``TypeError``, e.g. CPU tensors) is raised at once. ``model_config`` (FlexKV's
    ``ModelConfig``) is checked against the layout before anything is sent. Returns the plan.
    """
    if isinstance(source, FlexKVPlan):
        if model_config is not None:
            check_against_model_config(source, model_config)
        p = source
    else:
        p = plan(source, model_config=model_config, **plan_options)
    layout = p.to_flexkv()
    for attempt in range(1, attempts + 1):
        try:
            client.register_to_server(list(p.tensors), layout, override_device_id=override_device_id)
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            if attempt == attempts:
                raise AdapterError(f"FlexKV registration failed after {attempts} attempts: {exc}") from exc
            logger.warning("FlexKV registration attempt %d/%d failed: %s; retrying", attempt, attempts, exc)
            time.sleep(interval_s)
        else:
            logger.info("registered with FlexKV: %s", p)
            return p
    raise AdapterError("attempts must be >= 1")
