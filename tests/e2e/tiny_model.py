"""A tiny random Llama with an offline tokenizer, built by the tests and never downloaded.

Seeded, so the same arguments give the same weights and so the same greedy tokens on every run.
One KV head: vLLM's CPU attention backend only has the head-major layout, which FlexKV reads
right (and the plugin accepts) with a single head. Run in an engine's environment (transformers):
``python -m tests.e2e.tiny_model DIR`` writes the model to DIR and prints DIR.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

VOCAB_WORDS = 500  # "w0" .. "w499", plus the special tokens below


@dataclass(frozen=True)
class TinyLlama:
    layers: int = 2
    hidden: int = 128
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 256
    init_range: float = 0.2  # large enough that the KV a step reads changes its greedy token
    dtype: str = "bfloat16"
    seed: int = 0
    sliding_window: int | None = None  # every layer sliding-window (vLLM then makes a SlidingWindowSpec group)


SPECIAL = ["<unk>", "<s>", "</s>"]


def prompt_ids(words: list[int]) -> list[int]:
    """Token ids of the words ``w<i>`` (after the special tokens), for engines given ids directly."""
    return [len(SPECIAL) + w for w in words]


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + [f"w{i}" for i in range(VOCAB_WORDS)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)


def build(out: Path, spec: TinyLlama = TinyLlama()) -> Path:
    """Write config, weights and tokenizer to ``out`` (once: a stamp of ``spec`` says what is there)."""
    stamp = out / "tiny_model.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=len(SPECIAL) + VOCAB_WORDS,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=1024,
        initializer_range=spec.init_range,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype=spec.dtype,
        **({"sliding_window": spec.sliding_window} if spec.sliding_window is not None else {}),
    )
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(out)
    stamp.write_text(json.dumps(asdict(spec)))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
