"""The library's configuration: one pydantic-settings model.

Order of precedence, highest first:

1. explicit arguments (``load_settings(page_size=16)``, command-line flags);
2. the library's environment variables, ``FLEXKV_ADAPTER_<FIELD>``;
3. FlexKV's own variables for the same thing (``FLEXKV_MASTER_HOST``, ``FLEXKV_MASTER_PORTS``,
   ``FLEXKV_SERVER_RECV_PORT``), so nothing is configured twice;
4. a YAML file: the ``config_file`` argument, else ``$FLEXKV_ADAPTER_CONFIG``;
5. defaults.

Invalid values, unknown keys (in the file or as ``FLEXKV_ADAPTER_*`` variables) and wrong types
fail at load time with :class:`~flexkv_adapter.errors.SettingsError` naming the key, the value,
where it came from, and what was expected.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from .errors import SettingsError

ENV_PREFIX = "FLEXKV_ADAPTER_"
CONFIG_ENV = "FLEXKV_ADAPTER_CONFIG"
Port = Annotated[int, Field(ge=1, le=65535)]
_yaml_file: ContextVar[Path | None] = ContextVar("flexkv_adapter_yaml_file", default=None)


def _env(field: str, *flexkv: str) -> Any:
    """Accept the field name (arguments, YAML), our prefixed variable, then FlexKV's variables."""
    return AliasChoices(field, f"{ENV_PREFIX}{field.upper()}", *flexkv)


class AdapterSettings(BaseSettings):
    """Every setting of flexkv-adapter (see ``configs/flexkv-adapter.example.yaml``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", populate_by_name=True, frozen=True)

    # adapt() / plan() / register()
    page_size: Annotated[int, Field(gt=0)] | None = None
    hybrid: Literal["error", "attention_only"] = "error"
    tp_size: Annotated[int, Field(gt=0)] = 1
    total_kv_heads: Annotated[int, Field(gt=0)] | None = None
    replicated_kv_heads: bool = False
    align_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    register_attempts: Annotated[int, Field(gt=0)] = 360
    register_interval_s: Annotated[float, Field(ge=0)] = 1.0

    # multi-node deployment (FlexKV's variables accepted too)
    nnodes: Annotated[int, Field(gt=0)] = 1
    node_rank: Annotated[int, Field(ge=0)] = 0
    master_host: str | None = Field(None, validation_alias=_env("master_host", "FLEXKV_MASTER_HOST"))
    master_ports: Annotated[tuple[Port, Port, Port], NoDecode] = Field(
        (5556, 5557, 5558), validation_alias=_env("master_ports", "FLEXKV_MASTER_PORTS")
    )
    server_recv_port: str = Field(
        "ipc:///tmp/flexkv_server", validation_alias=_env("server_recv_port", "FLEXKV_SERVER_RECV_PORT")
    )
    allow_loopback_master: bool = False

    # scripts/start_remote.py
    transfer_manager: str = "flexkv.transfer_manager:TransferManagerOnRemote"
    connect_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    handshake_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    gpu_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    engine_timeout_s: Annotated[float, Field(gt=0)] = 900.0
    grace_s: Annotated[float, Field(gt=0)] = 30.0
    reap_grace_s: Annotated[float, Field(gt=0)] = 25.0
    probe_interval_s: Annotated[float, Field(gt=0)] = 5.0
    master_lost_s: Annotated[float, Field(gt=0)] = 30.0
    keep_cuda_visible_devices: bool = False
    health_host: str = "127.0.0.1"
    health_port: Port | None = None
    ready_file: Path | None = None
    lock_dir: Path | None = None  # None: $XDG_RUNTIME_DIR, else a private /tmp/flexkv-adapter-<uid>

    @field_validator("master_ports", mode="before")
    @classmethod
    def _split_ports(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",")]
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                raise ValueError("expected three comma-separated port numbers like 5556,5557,5558") from None
        return value

    @field_validator("master_ports")
    @classmethod
    def _distinct_ports(cls, value: tuple[int, int, int]) -> tuple[int, int, int]:
        if len(set(value)) != 3:
            raise ValueError(f"the three master ports must be distinct, got {value}")
        return value

    @model_validator(mode="after")
    def _node_rank_in_range(self) -> AdapterSettings:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be < nnodes {self.nnodes}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = _yaml_file.get()
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if yaml_file is not None:
            sources += (YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),)
        return sources


def _env_names(field: str) -> list[str]:
    info = AdapterSettings.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices[1:]]
    return [f"{ENV_PREFIX}{field.upper()}"]


def _known_env() -> set[str]:
    return {name for field in AdapterSettings.model_fields for name in _env_names(field)} | {CONFIG_ENV}


def config_file_in_use(config_file: str | os.PathLike[str] | None = None) -> Path | None:
    chosen = config_file or os.environ.get(CONFIG_ENV)
    return Path(chosen) if chosen else None


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> AdapterSettings:
    """Resolve settings from arguments, environment and YAML (see the module docstring)."""
    path = config_file_in_use(config_file)
    if path is not None and not path.is_file():
        raise SettingsError(f"config file {path} does not exist (from {'argument' if config_file else CONFIG_ENV})")
    unknown = sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in _known_env())
    if unknown:
        hints = [f"{u} (did you mean {m[0]}?)" if (m := get_close_matches(u, _known_env(), 1)) else u for u in unknown]
        raise SettingsError(f"unknown environment variable(s): {', '.join(hints)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    token = _yaml_file.set(path)
    try:
        return AdapterSettings(**overrides)
    except ValidationError as exc:
        origins = setting_sources(path, overrides)
        lines, keys = [], []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else "settings"
            origin = origins.get(key, "settings")
            keys.append(key)
            lines.append(f"{key}={err.get('input')!r} (from {origin}): {err['msg']}")
        raise SettingsError("invalid settings:\n  " + "\n  ".join(lines), tuple(keys)) from None
    finally:
        _yaml_file.reset(token)


def setting_sources(config_file: Path | None = None, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """Where each setting's value comes from: argument, env NAME, file PATH, or default."""
    import yaml

    from_file: dict[str, Any] = {}
    if config_file is not None and config_file.is_file():
        loaded = yaml.safe_load(config_file.read_text()) or {}
        from_file = loaded if isinstance(loaded, dict) else {}
    found: dict[str, str] = {}
    for field in AdapterSettings.model_fields:
        env = next((n for n in _env_names(field) if n in os.environ), None)
        if overrides and field in overrides:
            found[field] = "argument"
        elif env:
            found[field] = f"env {env}"
        elif field in from_file:
            found[field] = f"file {config_file}"
        else:
            found[field] = "default"
    for key in from_file:
        found.setdefault(str(key), f"file {config_file}")
    return found
