"""Tests of flexkv_adapter/model."""
