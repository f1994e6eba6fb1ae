"""Tests of flexkv_adapter/hybrid."""
