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

import contextlib
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ..errors import SettingsError
from ..text import clip, short_repr
from .hosts import is_unspecified, resolvable_name
from .integers import decimal_text
from .ipc_endpoint import server_recv_port
from .problems import did_you_mean, known_keys, problem
from .strict import (
    COLLECTIVE_MAX_S,
    EnvNumbers,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    integer_rule,
)
from .yamlfile import as_path, read_yaml_mapping, shown

ENV_PREFIX = "FLEXKV_ADAPTER_"
CONFIG_ENV = "FLEXKV_ADAPTER_CONFIG"
Port = Annotated[int, integer_rule(1), Field(le=65535)]
# Durations, bounded by what consumes them (checked at load, before anything connects):
WAIT_MAX_S = 1e9  # Event.wait/sleep/socket timeouts (CPython's limit is about 9.2e9 s)
ZMQ_MS_MAX_S = (2**31 - 1) / 1000  # ZMQ heartbeat options are 32-bit milliseconds (about 24.8 days)
Seconds = Annotated[PositiveFloat, Field(le=WAIT_MAX_S)]
SecondsOrZero = Annotated[NonNegativeFloat, Field(le=WAIT_MAX_S)]
ZmqSeconds = Annotated[PositiveFloat, Field(le=ZMQ_MS_MAX_S)]
FAILED_VISIBLE_MAX_S = 60.0  # the engine polls every 0.5 s; longer only delays a failed remote's restart
# Settings the kernel, ZMQ, getaddrinfo or importlib receive as strings: none may hold NUL.
_PATH_FIELDS = ("server_recv_port", "ready_file", "lock_dir", "transfer_manager", "master_host", "health_host")
_file_data: ContextVar[dict[str, Any] | None] = ContextVar("flexkv_adapter_file_data", default=None)


PATH_MAX = 4095  # bytes, Linux's PATH_MAX less the terminating NUL
NAME_MAX = 255  # bytes per path component


def _plain_text(value: Any) -> Any:
    if not isinstance(value, (str, os.PathLike)):
        return value  # the type check reports it
    text = str(os.fspath(value))
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad == "\0":
        raise ValueError("contains a NUL character, which no path, address or name can hold")
    if bad is not None:
        raise ValueError(f"contains the control character {bad!r}; paths, addresses and names here hold none")
    try:
        os.fsencode(text)
    except UnicodeError:
        raise ValueError("holds a character the filesystem encoding cannot encode (a lone surrogate)") from None
    return value


def _absolute_path(value: Any) -> Any:
    if not isinstance(value, (str, os.PathLike)):
        return value
    text = str(os.fspath(value))
    if not text:
        raise ValueError("is empty; give an absolute path")
    if not text.startswith("/"):
        raise ValueError(
            "must be an absolute path: start_remote and the engine resolve a relative one against their own "
            "working directories, which differ"
        )
    raw = os.fsencode(text)
    if len(raw) > PATH_MAX:
        raise ValueError(f"is {len(raw)} bytes; a path holds at most {PATH_MAX} bytes (PATH_MAX)")
    if any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise ValueError(f"has a component over {NAME_MAX} bytes (NAME_MAX)")
    return value


def _env(field: str, *flexkv: str) -> Any:
    """Accept the field name (arguments, YAML), our prefixed variable, then FlexKV's variables."""
    return AliasChoices(field, f"{ENV_PREFIX}{field.upper()}", *flexkv)


class AdapterSettings(BaseSettings):
    """Every setting of flexkv-adapter (see ``configs/flexkv-adapter.example.yaml``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", populate_by_name=True, frozen=True)

    # adapt() / plan() / register()
    page_size: PositiveInt | None = None
    hybrid: Literal["error", "attention_only"] = "error"
    tp_size: PositiveInt = 1
    total_kv_heads: PositiveInt | None = None
    align_timeout_s: Annotated[PositiveFloat, Field(le=COLLECTIVE_MAX_S)] = 60.0  # align_across_ranks' bound
    register_attempts: PositiveInt = 360
    register_interval_s: SecondsOrZero = 1.0

    # multi-node deployment (FlexKV's variables accepted too)
    nnodes: PositiveInt = 1
    node_rank: NonNegativeInt = 0
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
    connect_timeout_s: Seconds = 300.0
    handshake_timeout_s: Seconds = 300.0
    gpu_timeout_s: Seconds = 600.0
    engine_timeout_s: Seconds = 900.0
    grace_s: Seconds = 30.0
    reap_grace_s: Seconds = 25.0
    probe_interval_s: ZmqSeconds = 5.0
    master_lost_s: ZmqSeconds = 30.0
    keep_cuda_visible_devices: bool = False
    health_host: str = "127.0.0.1"
    health_port: Port | None = None
    failed_visible_s: Annotated[NonNegativeFloat, Field(le=FAILED_VISIBLE_MAX_S)] = 2.0  # serve `failed`, then exit
    ready_file: Path | None = None
    lock_dir: Path | None = None  # None: $XDG_RUNTIME_DIR, else a private /tmp/flexkv-adapter-<uid>

    # SGLang plugin: enabled by SGLANG_PLUGINS=flexkv_adapter or the variable FLEXKV_ADAPTER_SGLANG=1 (read
    # before the settings load). On nodes >= 1, remote "engine" lets FlexKV spawn its remote, "external"
    # waits for scripts/start_remote.py instead.
    sglang: bool = False
    remote: Literal["engine", "external"] = "engine"
    remote_wait_s: Seconds = 600.0
    remote_absent_s: Seconds = 60.0
    # "namespaced": requests with a LoRA, extra_key or cache_salt use FlexKV under a namespace of their own; "skip":
    # they bypass FlexKV; "shared": they use it by token ids alone, as SGLang does, and can hit another tenant's KV.
    sglang_namespaced_requests: Literal["namespaced", "skip", "shared"] = "namespaced"

    # vLLM reset_cache() and SGLang flush: the longest they wait for FlexKV transfers in flight before FlexKV's reset.
    reset_wait_s: Seconds = 30.0
    # Both plugins: at most one INFO line of FlexKV's hits and restored blocks per this many seconds; 0: none.
    hits_log_interval_s: SecondsOrZero = 60.0

    @field_validator("master_host", "health_host")
    @classmethod
    def _a_name_to_resolve(cls, value: str | None) -> str | None:
        return None if value is None else resolvable_name(value)

    @field_validator("health_host")
    @classmethod
    def _an_address_to_listen_on(cls, value: str) -> str:
        """Empty, the health endpoint could not listen (start_remote exits 9): a dry run must say so."""
        if not value.strip():
            raise ValueError("is empty: give the address the health endpoint listens on (default 127.0.0.1)")
        return value

    @field_validator("master_host")
    @classmethod
    def _an_address_to_connect_to(cls, value: str | None) -> str | None:
        if value is not None and is_unspecified(value):
            raise ValueError(
                "is a wildcard (unspecified) address that a server binds to, not the address of a master; "
                "give node 0's reachable IP address or host name"
            )
        return value

    @field_validator(*_PATH_FIELDS, mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        """The kernel, ZMQ and getaddrinfo refuse NUL or an unencodable character late, as a raw
        ValueError or UnicodeEncodeError; a newline splits every log line that names the value."""
        return _plain_text(value)

    @field_validator("ready_file", "lock_dir", mode="before")
    @classmethod
    def _usable_path(cls, value: Any) -> Any:
        """Absolute (start_remote and the engine run in different directories) and within the
        kernel's PATH_MAX and NAME_MAX, so no consumer meets ENAMETOOLONG later."""
        return _absolute_path(_plain_text(value))

    @field_validator("server_recv_port")
    @classmethod
    def _ipc_path_fits(cls, value: str) -> str:
        """The one check of an ipc endpoint FlexKV derives socket names from (:mod:`.ipc_endpoint`)."""
        return server_recv_port(value)

    @field_validator("transfer_manager")
    @classmethod
    def _module_colon_class(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", value, re.ASCII):
            raise ValueError("expected 'module:Class', like flexkv.transfer_manager:TransferManagerOnRemote")
        return value

    @field_validator("master_ports", mode="before")
    @classmethod
    def _split_ports(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = [decimal_text(p) for p in value.split(",")]
            if not all(isinstance(p, int) for p in parts):
                raise ValueError("expected three comma-separated port numbers like 5556,5557,5558")
            return tuple(parts)
        return value  # each item goes through the integer rule (Port)

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
        file_data = _file_data.get()
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, EnvNumbers(settings_cls, env_settings))
        if file_data:
            sources += (InitSettingsSource(settings_cls, init_kwargs=file_data),)
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
    """The settings file: the argument, else ``$FLEXKV_ADAPTER_CONFIG``, else None."""
    if config_file is not None and not isinstance(config_file, (str, os.PathLike)):
        raise SettingsError(f"config_file must be a path, not {type(config_file).__name__}: {short_repr(config_file)}")
    chosen = config_file or os.environ.get(CONFIG_ENV)
    return as_path(chosen, SettingsError, "config file") if chosen else None


def _read_file(path: Path, origin: str) -> dict[str, Any]:
    try:
        return read_yaml_mapping(path, SettingsError, "config file")[1]
    except SettingsError as exc:
        raise SettingsError(f"{exc} (from {origin})") from None


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> AdapterSettings:
    """Resolve settings from arguments, environment and YAML (see the module docstring)."""
    path = config_file_in_use(config_file)
    data = _read_file(path, "argument" if config_file else CONFIG_ENV) if path is not None else None
    unknown = sorted(k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in _known_env())
    if unknown:
        hints = [f"{u}{did_you_mean(u, _known_env(), ENV_PREFIX)}" for u in unknown]
        raise SettingsError(f"unknown environment variable(s): {', '.join(hints)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    token = _file_data.set(data)
    try:
        return AdapterSettings(**overrides)
    except ValidationError as exc:
        raise _invalid(exc, _sources(path, data or {}, overrides)) from None
    finally:
        _file_data.reset(token)


def _invalid(exc: ValidationError, origins: dict[str, str], limit: int = 10) -> SettingsError:
    """One line per problem: key, value (truncated), where it came from, what was expected."""
    lines: list[str] = []
    keys: list[str] = []
    for err in exc.errors():
        raw = str(err["loc"][0]) if err["loc"] else "settings"
        key = clip(raw, 60)
        keys.append(key)
        if len(lines) < limit:
            value, origin = short_repr(err.get("input")), origins.get(raw, "settings")
            lines.append(f"{key}={value} (from {origin}): {problem(err, AdapterSettings, origin.startswith('file '))}")
    if len(keys) > limit:
        lines.append(f"and {len(keys) - limit} more")
    lines += [note] if (note := known_keys(exc.errors(), AdapterSettings)) else []
    return SettingsError("invalid settings:\n  " + "\n  ".join(lines), tuple(keys))


def setting_sources(config_file: Path | None = None, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """Where each setting's value comes from: argument, env NAME, file PATH, or default."""
    data: dict[str, Any] = {}
    if config_file is not None:
        with contextlib.suppress(SettingsError):  # load_settings reports it
            data = read_yaml_mapping(config_file, SettingsError, "config file")[1]
    return _sources(config_file, data, overrides or {})


def _sources(config_file: Path | None, from_file: dict[str, Any], overrides: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for field in AdapterSettings.model_fields:
        env = next((n for n in _env_names(field) if n in os.environ), None)
        if field in overrides:
            found[field] = "argument"
        elif env:
            found[field] = f"env {env}"
        elif field in from_file:
            found[field] = f"file {shown(config_file)}"
        else:
            found[field] = "default"
    for key in overrides:  # an unknown one is named as an argument's
        found.setdefault(str(key), "argument")
    for key in from_file:
        found.setdefault(str(key), f"file {shown(config_file)}")
    return found
