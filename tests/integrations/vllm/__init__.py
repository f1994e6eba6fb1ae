"""Unit tests of flexkv_adapter/integrations/vllm that run in the main suite."""
