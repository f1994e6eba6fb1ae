"""The ``flexkv-adapter`` command: demo, doctor, inspect and start-remote."""
