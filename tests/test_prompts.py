"""Prompt sets (specdec.prompts): rows through the template, then the category filter and the limits, in order."""

from __future__ import annotations

import json

import pytest

from specdec.prompts import PromptSet, load_prompts


@pytest.fixture
def jsonl(tmp_path):
    rows = [{"id": f"r{i}", "kind": kind, "q": f"question {i}"} for i, kind in enumerate("aabab")]
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_rows_become_prompts_filtered_in_order(jsonl) -> None:
    spec = PromptSet("toy", "json", jsonl.name, "Q: {q}", id_field="id", category_field="kind")
    every = load_prompts(spec, jsonl.parent)
    assert [(p.id, p.category, p.text) for p in every[:2]] == [("r0", "a", "Q: question 0"), ("r1", "a", "Q: question 1")]
    two_each = load_prompts(PromptSet(**{**spec.__dict__, "n_per_category": 2}), jsonl.parent)
    assert [p.id for p in two_each] == ["r0", "r1", "r2", "r4"]
    only_b = load_prompts(PromptSet(**{**spec.__dict__, "categories": ("b",), "n_prompts": 1}), jsonl.parent)
    assert [p.id for p in only_b] == ["r2"]
    unnamed = load_prompts(PromptSet("toy", "json", str(jsonl), "{q}"))  # an absolute path; ids by index
    assert unnamed[3].id == "toy-3" and unnamed[3].category == "toy"


@pytest.mark.parametrize("change,message", [
    ({"template": "{missing}"}, "template '{missing}' refers to 'missing'"),
    ({"categories": ("c",)}, r"categories: \['c'\] not in dataset toy; choices: \['a', 'b'\]"),
    ({"path": "nowhere.jsonl"}, "path: .*nowhere.jsonl does not exist"),
])  # fmt: skip
def test_a_bad_field_is_named(jsonl, change, message) -> None:
    spec = PromptSet(**{**PromptSet("toy", "json", jsonl.name, "{q}", category_field="kind").__dict__, **change})
    with pytest.raises(ValueError, match=message):
        load_prompts(spec, jsonl.parent)
