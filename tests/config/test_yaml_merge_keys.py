"""YAML merge keys (``<<``) write their keys: a key written twice, by a merge or not, is an error (docs/settings.md)."""

from __future__ import annotations

import pytest

from flexkv_adapter import AdapterError
from flexkv_adapter.readers.spec import load_spec

HEAD = "name: merged\naxes: L KV N H D\n"
TWICE = {
    "merge plus an explicit key": "<<: {page_size: 16}\npage_size: 32\n",
    "the merge key twice": "<<: {page_size: 16}\n<<: {layer_num: 2}\n",
    "a merge list naming one key twice": "<<: [{page_size: 16}, {page_size: 32}]\n",
    "a merge of a mapping that merges": "<<: {<<: {page_size: 16}, layer_num: 2}\npage_size: 32\n",
}


@pytest.mark.parametrize("case", TWICE)
def test_a_key_written_twice_through_merge_keys_is_an_error(case, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + TWICE[case])
    with pytest.raises(AdapterError, match="appears twice in one mapping"):
        load_spec(path)


def test_a_merge_that_writes_each_key_once_is_read(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + "<<: [{page_size: 16}, {layer_num: 2}]\nhead_num: 4\n")
    spec = load_spec(path)
    assert (spec.page_size, spec.layer_num, spec.head_num) == (16, 2, 4)
