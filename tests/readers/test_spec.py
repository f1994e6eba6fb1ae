"""Layout specs: YAML loading, validation, inspect, and the pin between specs and built-in recognition."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flexkv_adapter import AdapterError, UnsupportedPoolError, adapt
from flexkv_adapter.cli.main import main
from flexkv_adapter.cli.samples import SAMPLES
from flexkv_adapter.flexkv import plan
from flexkv_adapter.readers.spec import LayoutSpec, builtin_specs, load_spec

from ..helpers import distinct

LAYOUTS = sorted((Path(__file__).parents[2] / "configs" / "layouts").glob("*.yaml"))


def test_every_shipped_spec_loads_and_inspects(capsys):
    assert len(LAYOUTS) >= 8
    assert main(["inspect", *map(str, LAYOUTS)]) == 0
    out = capsys.readouterr().out
    assert out.count("verdict:") == len(LAYOUTS)


@pytest.mark.parametrize(
    ("name", "pool", "check"),
    [
        (
            "sglang-mha",
            lambda: SimpleNamespace(
                k_buffer=[distinct((32, 2, 8))] * 2, v_buffer=[distinct((32, 2, 8))] * 2, page_size=16
            ),
            "adapt",
        ),
        ("sglang-mla", lambda: SimpleNamespace(kv_buffer=[distinct((32, 1, 8))] * 2, page_size=16), "adapt"),
        ("vllm-v0.21-kv-first", lambda: {f"layers.{i}.attn": distinct((2, 3, 16, 2, 8)) for i in range(2)}, "adapt"),
        ("vllm-v0.23-blocks-first", lambda: {f"layers.{i}.attn": distinct((3, 2, 16, 2, 8)) for i in range(2)}, "plan"),
        ("flat-layer-first", lambda: SimpleNamespace(kv_cache=distinct((2, 2, 32, 2, 8)), page_size=16), "adapt"),
        ("flat-kv-first", lambda: SimpleNamespace(kv_cache=distinct((2, 2, 32, 2, 8)), page_size=16), "adapt"),
        ("flat-mla", lambda: SimpleNamespace(kv_cache=distinct((2, 32, 8)), page_size=16), "adapt"),
        ("trtllm-block-first", lambda: distinct((3, 2, 2, 16, 2, 8)), "plan"),
    ],
)
def test_shipped_specs_describe_their_layouts(name, pool, check):
    path = next(p for p in LAYOUTS if p.stem == name)
    spec = load_spec(path)
    if check == "adapt":
        view = adapt(pool(), spec=path)
        assert view.report.recognizer == f"spec:{name}" and view.report.bytes_copied == 0
        assert spec.addressability()[0]
    else:
        assert not spec.addressability()[0]
        assert plan(pool(), **spec.to_options()).num_layer == 2


def test_specs_pin_to_builtin_recognition():
    """adapt(pool) and adapt(pool, spec=<the reading it reported>) give the same tensors."""
    for sample in SAMPLES:
        if sample.refused_with or "hybrid" in sample.options:
            continue
        view = adapt(sample.build(), **sample.options)
        r = view.report
        attrs = None if r.attributes[0].startswith("<pool>") else list(r.attributes)
        axes = r.reading.split("[", 1)[1].rstrip("]")
        spec = LayoutSpec(name="pinned", kind=r.kind, attrs=attrs, axes=axes)
        pool = sample.build()
        again = adapt(pool, spec=spec, **{k: v for k, v in sample.options.items() if k != "axes"})
        assert [(t.shape, t.stride(), t.dtype) for t in again.tensors()] == [
            (t.shape, t.stride(), t.dtype) for t in view.tensors()
        ], sample.name


def test_builtin_specs_enumerate_every_reading():
    specs = builtin_specs()
    axes = {(s.kind, s.axes) for s in specs}
    assert ("mha", "KV P T H D") in axes and ("mla", "N H D") in axes and ("mha", "P KV T H D") in axes
    assert any(s.attrs == ["k_buffer", "v_buffer"] for s in specs)


def test_spec_from_dict_and_object_and_dotted_attrs():
    inner = SimpleNamespace(k=[distinct((32, 2, 8))] * 2, v=[distinct((32, 2, 8))] * 2)
    pool = SimpleNamespace(cache=inner)
    spec = {"name": "nested", "kind": "mha", "attrs": ["cache.k", "cache.v"], "axes": "N H D", "page_size": 16}
    view = adapt(pool, spec=spec)
    assert view.k_buffer[0].data_ptr() == inner.k[0].data_ptr()
    assert adapt(pool, spec=LayoutSpec(**spec)).report.recognizer == "spec:nested"


def test_a_spec_that_does_not_match_names_what_disagreed():
    pool = SimpleNamespace(kv_cache=distinct((2, 2, 32, 4, 8)), page_size=16)
    with pytest.raises(UnsupportedPoolError, match="kv_cache: heads would be 4, expected 2"):
        adapt(pool, spec={"name": "x", "attrs": ["kv_cache"], "axes": "L KV N H D", "head_num": 2})
    with pytest.raises(UnsupportedPoolError, match="attributes is present .*: missing"):
        adapt(pool, spec={"name": "x", "attrs": ["missing"], "axes": "L KV N H D"})
    with pytest.raises(UnsupportedPoolError, match="has 5 dims but \\[L N D\\] has 3"):
        adapt(pool, spec={"name": "x", "attrs": ["kv_cache"], "axes": "L N D"})


def test_invalid_specs_and_conflicting_options(tmp_path):
    with pytest.raises(AdapterError, match="axes='L KV Q'.*unknown axis"):
        load_spec({"name": "x", "axes": "L KV Q"})
    with pytest.raises(AdapterError, match="colour=.*unknown key; known keys: attrs, axes"):
        load_spec({"name": "x", "axes": "N H D", "colour": "red"})
    with pytest.raises(AdapterError, match="not a torch dtype"):
        load_spec({"name": "x", "axes": "N H D", "dtype": "bfloat17"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(AdapterError, match="YAML mapping"):
        load_spec(bad)
    with pytest.raises(AdapterError, match="missing.yaml does not exist"):
        load_spec(tmp_path / "missing.yaml")
    pool = SimpleNamespace(kv_cache=distinct((2, 2, 32, 2, 8)), page_size=16)
    with pytest.raises(AdapterError, match="contradicts spec"):
        adapt(pool, spec={"name": "x", "attrs": ["kv_cache"], "axes": "L KV N H D"}, axes="KV L N H D")


def test_inspect_json_and_invalid_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\naxes: N N D\n")
    assert main(["inspect", "--json", str(LAYOUTS[0]), str(bad)]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[0])["axes"] and "an axis twice" in err


def test_dtype_in_a_spec_reinterprets():
    pool = SimpleNamespace(kv_cache=[torch.zeros(32, 1, 8, dtype=torch.uint8)], page_size=16)
    view = adapt(pool, spec={"name": "fp8", "attrs": ["kv_cache"], "axes": "N H D", "dtype": "float8_e4m3fn"})
    assert view.dtype == torch.float8_e4m3fn


def test_a_spec_field_is_refused_by_the_option_rule_before_the_pool_is_read_by_adapt_and_plan():
    """A spec's ``layer_ids`` naming a layer twice is refused by the option rule first, by adapt() and plan() alike,
    before a pool attribute that raises is read (plan() used to read the pool's planes first)."""

    class Raising(SimpleNamespace):
        @property
        def index_k_with_scale_buffer(self) -> None:
            raise RuntimeError("boom")

    pool = Raising(k_buffer=[distinct((32, 2, 8))] * 2, v_buffer=[distinct((32, 2, 8))] * 2, page_size=16)
    spec = {"name": "s", "attrs": ["k_buffer", "v_buffer"], "axes": "N H D", "layer_ids": [0, 1]}
    with pytest.raises(AdapterError, match="raised RuntimeError when read"):  # control: the pool's own fault
        plan(pool, spec=spec, tp_size=1)
    for call in (adapt, lambda p, **o: plan(p, tp_size=1, **o)):
        with pytest.raises(AdapterError, match="names a layer twice"):
            call(pool, spec={**spec, "layer_ids": [0, 0]})
