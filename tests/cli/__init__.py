"""Tests of flexkv_adapter/cli."""
