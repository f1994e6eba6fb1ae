"""The hybrid policy: what happens to state beside the KV (offloaded whole, refused by name, or attention-only)."""
