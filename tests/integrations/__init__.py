"""Unit tests of flexkv_adapter/integrations that run in the main suite."""
