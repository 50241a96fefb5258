"""Prompt sets (specdec.prompts): rows through the template, then the length and category filters and the limits, in
order."""

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


def test_the_length_filter_keeps_prompts_of_min_to_max_characters_before_the_limits(tmp_path) -> None:
    """dataset=long's filter: the prompt's characters with the template applied, both ends kept, before n_prompts;
    a filter that keeps nothing is refused, naming the lengths."""
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps({"id": f"n{n}", "q": "x" * n}) + "\n" for n in (10, 3, 7, 5, 8)))
    spec = PromptSet("toy", "json", path.name, "Q: {q}", id_field="id", min_chars=8, max_chars=10)  # 3 + n chars
    assert [p.id for p in load_prompts(spec, tmp_path)] == ["n7", "n5"]
    assert [p.id for p in load_prompts(PromptSet(**{**spec.__dict__, "n_prompts": 1}), tmp_path)] == ["n7"]
    with pytest.raises(ValueError, match="gave no prompts after the filters; check its categories and lengths"):
        load_prompts(PromptSet(**{**spec.__dict__, "min_chars": 100}), tmp_path)


@pytest.mark.parametrize("change,message", [
    ({"template": "{missing}"}, "template '{missing}' refers to 'missing'"),
    ({"categories": ("c",)}, r"categories: \['c'\] not in dataset toy; choices: \['a', 'b'\]"),
    ({"path": "nowhere.jsonl"}, "path: .*nowhere.jsonl does not exist"),
    ({"source": "csv"}, "source must be one of json, hub, sharegpt, got 'csv'"),
    ({"split": "test"}, "split: a JSON Lines file has one split, 'train', not 'test'"),
])  # fmt: skip
def test_a_bad_field_is_named(jsonl, change, message) -> None:
    spec = PromptSet(**{**PromptSet("toy", "json", jsonl.name, "{q}", category_field="kind").__dict__, **change})
    with pytest.raises(ValueError, match=message):
        load_prompts(spec, jsonl.parent)


@pytest.mark.parametrize("line,message", [
    ("{'id': 1}", r"bad\.jsonl:2: not JSON"),
    ("[1, 2]", r"bad\.jsonl:2: a row must be a JSON object, not list"),
])  # fmt: skip
def test_a_bad_line_is_named(tmp_path, line, message) -> None:
    (tmp_path / "bad.jsonl").write_text('{"q": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_prompts(PromptSet("toy", "json", "bad.jsonl", "{q}"), tmp_path)


def test_rows_get_every_field_and_blank_lines_are_skipped(tmp_path) -> None:
    """A row without a field another row has reads it as None (as datasets' json loader does)."""
    (tmp_path / "uneven.jsonl").write_text('{"q": "a", "hint": "h"}\n\n{"q": "b"}\n')
    prompts = load_prompts(PromptSet("toy", "json", "uneven.jsonl", "{q}/{hint}"), tmp_path)
    assert [p.text for p in prompts] == ["a/h", "b/None"]
