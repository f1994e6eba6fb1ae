"""Preflight checks: what would fail before an engine or the remote process finds out."""

from __future__ import annotations

import importlib
import importlib.util
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from ..config import lookup
from ..config.hosts import classify_host
from ..config.settings import AdapterSettings, config_file_in_use, load_settings, setting_sources
from ..errors import FLEXKV_INSTALL_HINT, SettingsError
from .doctor_engines import engine_rows

Status = Literal["ok", "warn", "error"]
LOOKUP_S = 5.0  # a resolver that does not answer must not hang a diagnosis


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def _import_check(name: str, module: str, needed_for: str, required: bool, hint: str = "") -> Check:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return Check(name, "error" if required else "warn", f"not installed; {needed_for}{hint}")
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, OSError (libcudart), anything a broken build raises
        return Check(
            name, "error" if required else "warn", f"import failed ({type(exc).__name__}: {exc}); {needed_for}"
        )
    return Check(name, "ok", f"{module} imports")


def settings_checks(s: AdapterSettings) -> list[Check]:
    """Consistency problems visible from the settings alone."""
    checks: list[Check] = []
    if s.nnodes > 1:
        if not s.master_host:
            checks.append(Check("master_host", "error", f"unset while nnodes={s.nnodes}; set FLEXKV_MASTER_HOST"))
        else:
            kind: str
            try:
                kind = classify_host(s.master_host, LOOKUP_S)
            except lookup.LookupTimedOut as exc:
                kind = "timed out"
                checks.append(
                    Check(
                        "master_host",
                        "error",
                        f"{s.master_host} did not resolve within {LOOKUP_S:g} s ({exc}); check this node's resolver",
                    )
                )
            if kind == "loopback" and not s.allow_loopback_master:
                checks.append(
                    Check(
                        "master_host",
                        "error",
                        f"{s.master_host} is loopback while nnodes={s.nnodes}; "
                        f"other nodes cannot reach it (allow_loopback_master for one-machine tests)",
                    )
                )
            elif kind == "unresolved":
                checks.append(Check("master_host", "error", f"{s.master_host} does not resolve"))
            elif kind == "unspecified":
                checks.append(
                    Check("master_host", "error", f"{s.master_host} resolves to a wildcard address, not a master's")
                )
            elif kind == "public":
                checks.append(
                    Check(
                        "master_host",
                        "warn",
                        f"{s.master_host} is a public address; FlexKV unpickles "
                        f"what arrives on its ports: keep them on a trusted network",
                    )
                )
            elif kind != "timed out":
                checks.append(Check("master_host", "ok", f"{s.master_host} ({kind})"))
    total, tp = s.total_kv_heads, s.tp_size
    if total is not None:
        if 1 < total < tp:
            checks.append(
                Check(
                    "kv_heads",
                    "error",
                    f"total_kv_heads={total} < tp_size={tp}: ranks hold replicated KV heads, which FlexKV reads "
                    f"correctly only when its ModelConfig counts the replicas (plan(..., model_config=) with "
                    f"num_kv_heads = heads per rank x tp_size)",
                )
            )
        elif total >= tp and total % tp:
            checks.append(Check("kv_heads", "error", f"total_kv_heads={total} is not divisible by tp_size={tp}"))
        else:
            checks.append(Check("kv_heads", "ok", f"{total} KV heads over tp_size={tp}"))
    return checks


def run_doctor(config_file: str | Path | None = None, require_flexkv: bool = False) -> dict[str, Any]:
    """All checks, resolved settings and their sources, as JSON-ready data."""
    checks = [Check("python", "ok", platform.python_version())]
    cuda = torch.cuda.is_available()
    checks.append(
        Check("torch", "ok", f"{torch.__version__}; CUDA devices: {torch.cuda.device_count() if cuda else 0}")
    )
    if not cuda:
        checks.append(Check("cuda", "warn", "no CUDA device: adapt() works, FlexKV registration needs CUDA tensors"))
    hint = f". {FLEXKV_INSTALL_HINT}"
    checks.append(
        _import_check("flexkv", "flexkv.common.storage", "needed by to_flexkv()/register()", require_flexkv, hint)
    )
    checks.append(_import_check("flexkv.c_ext", "flexkv.c_ext", "needed by start-remote", require_flexkv))
    checks += [Check(*row) for row in engine_rows()]
    settings: dict[str, Any] = {}
    try:
        path = config_file_in_use(config_file)
        s = load_settings(config_file)
    except SettingsError as exc:
        checks.append(Check("settings", "error", str(exc)))
    else:
        checks.append(Check("settings", "ok", f"loaded{f' (file {path})' if path else ''}"))
        checks += settings_checks(s)
        sources = setting_sources(path)
        settings = {
            k: {"value": str(v) if isinstance(v, Path) else v, "source": sources[k]} for k, v in s.model_dump().items()
        }
    return {"ok": all(c.status != "error" for c in checks), "checks": [asdict(c) for c in checks], "settings": settings}


def format_doctor(result: dict[str, Any]) -> str:
    rows = [(c["name"], c["status"].upper(), c["detail"]) for c in result["checks"]]
    w0 = max(len(r[0]) for r in rows)
    lines = [f"{name.ljust(w0)}  {status:5}  {detail}" for name, status, detail in rows]
    if result["settings"]:
        lines += ["", "settings:"]
        w = max(map(len, result["settings"]))
        lines += [f"  {k.ljust(w)}  {v['value']!s:<40} ({v['source']})" for k, v in result["settings"].items()]
    return "\n".join(lines)
