"""Tests of flexkv_adapter/config."""
