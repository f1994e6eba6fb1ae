"""Tests of flexkv_adapter/scripts."""
