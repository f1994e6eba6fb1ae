"""Tests of flexkv_adapter/gate."""
