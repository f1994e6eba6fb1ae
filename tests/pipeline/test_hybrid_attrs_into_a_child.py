"""``attrs=`` naming a sub-object's KV never leaves that sub-object's planes out unnamed.

``attrs=["full_kv_pool.kv_buffer"]`` (or ``["inner.k_buffer", "inner.v_buffer"]``) read the named KV and
looked for scale planes and a DSA indexer only on the outer object: a child's FP4/MXFP8 scales or DSA
indexer were dropped without a word, and plan() registered the KV alone under every ``hybrid=``. Now each
plane is registered whole, listed as a side group (attention_only), or the call is refused naming it.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings

from flexkv_adapter import adapt

from ..hybrid_agreement import agreement
from ..strategies.hybrids import _mla
from ..strategies.wrappers import attrs_into_a_child_with_planes

SOME = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SOME
@given(attrs_into_a_child_with_planes())
def test_every_plane_of_the_named_child_is_registered_listed_or_refused(case):
    pool, options, planes = case
    adapted, _ = agreement(pool, options)
    if adapted[0] == "refused":
        assert "scale_buffer" in adapted[2] or "index_k_with_scale_buffer" in adapted[2], adapted[2]
        return
    view = adapted[1]
    kept = {t.data_ptr() for g in view.side_groups for t in g.tensors}
    if view.whole is not None:
        kept |= {t.data_ptr() for p in view.whole.planes for t in p.tensors}
    lost = [tuple(t.shape) for t in planes if t.numel() and t.data_ptr() not in kept]
    assert not lost, f"{options}: planes {lost} neither registered nor listed: {view.report}"


def test_control_a_named_child_without_planes_is_read_as_named():
    child = _mla([0, 1])
    view = adapt(SimpleNamespace(inner=child), attrs=["inner.kv_buffer"])
    assert view.side_groups == () and view.tensors()[0].data_ptr() == child.kv_buffer[0].data_ptr()
