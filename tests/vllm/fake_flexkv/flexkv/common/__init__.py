"""``flexkv.common``: the vLLM tier's own modules here, the shared layout stand-in (storage.py) beside it."""

from pathlib import Path

__path__.append(str(Path(__file__).parents[4] / "fake_flexkv" / "flexkv" / "common"))
