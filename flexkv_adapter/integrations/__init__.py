"""Engine drop-ins: one module per engine, each a no-op when its engine or FlexKV is absent."""
