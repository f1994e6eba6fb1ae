"""Unit tests of flexkv_adapter/integrations/sglang that run in the main suite."""
