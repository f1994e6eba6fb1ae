"""Tests of flexkv_adapter/flexkv."""
