"""``python -m flexkv_adapter``: the ``flexkv-adapter`` command, for environments without its console script."""

from .cli.main import main

raise SystemExit(main())
