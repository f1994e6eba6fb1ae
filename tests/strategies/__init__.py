"""Hypothesis strategies, one module per kind of input they generate.

cases (the Case and its check), pools, containers, hostile, integers, vllm, hybrids, wrappers, planes, remote.
"""
