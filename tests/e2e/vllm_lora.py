"""The LoRA scenario of the vLLM end-to-end run: two adapters made here for the tiny Llama, each offloaded to FlexKV
under its own namespace.

An adapter changes K and V (its q/k/v projections), so its KV and its greedy tokens are its own: a restore of
another adapter's KV shows in the tokens. Phases, each settled (FlexKV's stores done, vLLM's prefix cache empty):
LoRA 1 cold (stored), LoRA 1 again (restored: its cold tokens), LoRA 2 (none of LoRA 1's blocks), the base model
(none either), LoRA 1's name re-pointed at LoRA 2's path (vLLM keys by name and path: none). Negative control:
FlexKV's own ``_extract_namespace`` (the bare LoRA name) serves a re-pointed name the old adapter's KV, and the
tokens differ from that adapter's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RANK = 8


def build_adapter(out: Path, model: Path, seed: int) -> Path:
    """A seeded rank-8 LoRA on q_proj, k_proj and v_proj, in PEFT's format (what vLLM's LoRA loader reads)."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    hidden, head_dim = cfg["hidden_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dims = {"q_proj": cfg["num_attention_heads"] * head_dim, "k_proj": cfg["num_key_value_heads"] * head_dim}
    dims["v_proj"] = dims["k_proj"]
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, fan_out in dims.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(RANK, hidden, generator=generator) * 0.5).bfloat16()
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, RANK, generator=generator) * 0.5).bfloat16()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": RANK, "target_modules": list(dims), "bias": "none",
              "base_model_name_or_path": str(model), "task_type": "CAUSAL_LM", "lora_dropout": 0.0}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def scenarios(run: Any, model: Path, a: list[int], max_tokens: int, count: Any) -> dict[str, Any]:
    """The phases above; ``count(run, out, name, before)`` records the data plane's counters per phase."""
    from vllm.lora.request import LoRARequest

    one, two = build_adapter(model.parent / "lora1", model, 1), build_adapter(model.parent / "lora2", model, 2)
    phases = (
        ("lora_cold", LoRARequest("lora1", 1, str(one))),
        ("lora_restored", LoRARequest("lora1", 1, str(one))),
        ("lora_other", LoRARequest("lora2", 2, str(two))),
        ("lora_base", None),
        ("lora_repointed", LoRARequest("lora1", 3, str(two))),  # a new id: vLLM caches adapters by id
        ("control_cold", LoRARequest("ctl", 4, str(one))),  # FlexKV's own rule from here: the bare name
        ("control_repointed", LoRARequest("ctl", 5, str(two))),
    )
    out: dict[str, Any] = {"counters": {}}
    plugin_rule, own_rule = run.flexkv._extract_namespace, type(run.flexkv)._extract_namespace.__get__(run.flexkv)
    before = run.counters()
    for name, lora in phases:
        run.flexkv._extract_namespace = own_rule if name.startswith("control") else plugin_rule
        out[name] = run.generate(a, max_tokens, lora=lora)
        run.settle()
        before = count(run, out, name, before)
    return out
