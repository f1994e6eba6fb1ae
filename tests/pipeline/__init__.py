"""Tests of flexkv_adapter/pipeline."""
