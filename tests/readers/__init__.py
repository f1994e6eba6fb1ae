"""Tests of flexkv_adapter/readers."""
