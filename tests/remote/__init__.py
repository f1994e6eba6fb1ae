"""start_remote's tests (flexkv_adapter/remote) and their harness and stand-in."""
