"""One tensor for all layers, vLLM paged tensors, and 1-D byte buffers with a declared geometry."""

from __future__ import annotations

import pytest
import torch

from flexkv_adapter import AdapterError, MHAView, MLAView, NotAddressableError, adapt

from ..helpers import assert_aliases, distinct

L, N, H, D, PS = 3, 40, 4, 8, 16


def test_layer_first_single_tensor():
    f = distinct((L, 2, N, H, D))
    view = adapt(f, page_size=PS)
    assert isinstance(view, MHAView) and view.report.reading == "MHA [L KV N H D]"
    for i in range(L):
        assert_aliases(view.k_buffer[i], f[i, 0, :32], f)
        assert_aliases(view.v_buffer[i], f[i, 1, :32], f)


def test_kv_first_single_tensor():
    f = distinct((2, L, N, H, D))
    view = adapt(f, page_size=PS, layer_num=L)
    for i in range(L):
        assert_aliases(view.k_buffer[i], f[0, i, :32], f)
        assert_aliases(view.v_buffer[i], f[1, i, :32], f)


@pytest.mark.parametrize("shape", [(L, N, 12), (L, N, 1, 12)], ids=["L N D", "L N 1 D"])
def test_mla_single_tensor(shape):
    f = distinct(shape)
    view = adapt(f, page_size=PS)
    assert isinstance(view, MLAView)
    for i in range(L):
        assert_aliases(view.kv_buffer[i], f[i, :32].reshape(32, 1, 12), f)


def test_token_major_across_layers_is_refused_with_the_reason():
    f = distinct((N, L, 2, H, D))
    with pytest.raises(NotAddressableError, match="layer axis lies between consecutive tokens") as err:
        adapt(f, page_size=PS, axes="N L KV H D")
    assert "(32, 8, 1)" in str(err.value) and "stride=(192, 8, 1)" in str(err.value)


def test_vllm_kv_first_paged_tensor_views_flatten_pages():
    per_layer = [distinct((2, 5, PS, H, D), start=10_000 * i) for i in range(L)]
    view = adapt(per_layer, head_num=H)
    assert view.page_size == PS and view.num_blocks == 5
    for i in range(L):
        assert_aliases(view.k_buffer[i], per_layer[i][0].reshape(5 * PS, H, D), per_layer[i])


def test_vllm_blocks_first_paged_tensor_is_recognised_then_refused():
    per_layer = {f"layers.{i}.attn": distinct((5, 2, PS, H, D)) for i in range(L)}
    with pytest.raises(NotAddressableError, match="K/V axis lies between consecutive pages"):
        adapt(per_layer, head_num=H)


def test_head_major_declared_layout_is_refused():
    per_layer = [distinct((2, 5, H, PS, D)) for _ in range(L)]
    with pytest.raises(NotAddressableError, match="head-major"):
        adapt(per_layer, axes="KV P H T D")


def test_byte_buffer_with_declared_geometry_and_offset():
    nbytes = L * 2 * N * H * D * 2
    buf = torch.zeros(nbytes + 64, dtype=torch.uint8)
    view = adapt(buf, page_size=PS, shape=(L, 2, -1, H, D), dtype=torch.bfloat16, axes="L KV N H D", offset=64)
    assert view.report.recognizer == "byte-buffer" and view.dtype == torch.bfloat16
    typed = buf[64:].view(torch.bfloat16).view(L, 2, N, H, D)
    typed.copy_(distinct((L, 2, N, H, D)) % 200)
    for i in range(L):
        assert_aliases(view.v_buffer[i], typed[i, 1, :32], typed)
    assert view.k_buffer[0].data_ptr() == buf.data_ptr() + 64


def test_byte_buffer_without_declared_geometry_is_refused():
    with pytest.raises(AdapterError, match="declare its geometry"):
        adapt(torch.zeros(4096, dtype=torch.uint8), page_size=PS)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"shape": (L, 2, N, H, D), "offset": 3}, "offset=3"),
        ({"shape": (L, 2, N * 4, H, D)}, "needs"),
        ({"shape": (-1, -1, H, D)}, "at most one -1"),
    ],
)
def test_byte_buffer_geometry_errors(options, match):
    buf = torch.zeros(L * 2 * N * H * D * 2, dtype=torch.uint8)
    with pytest.raises(AdapterError, match=match):
        adapt(buf, page_size=PS, dtype=torch.bfloat16, axes="L KV N H D", **options)


def test_dtype_option_reinterprets_without_copying():
    f = torch.zeros(L, 2, N, H, D, dtype=torch.uint8)
    view = adapt(f, page_size=PS, dtype=torch.float8_e4m3fn)
    assert view.dtype == torch.float8_e4m3fn
    assert view.k_buffer[1].data_ptr() == f[1, 0].data_ptr()
