"""Training conversations (specdec.train.conversations): ShareGPT's cut-off file read up to its last whole record,
the repository's prompts as one-turn conversations, and an unknown source refused with the choices."""

from pathlib import Path

import pytest

from specdec.train.conversations import conversations, whole_records

ROOT = Path(__file__).resolve().parents[1]


def test_sharegpt_reading_stops_at_the_last_whole_record():
    text = '[\n {"id": "a", "conversations": []},\n {"id": "b", "conversations": [{"from": "human", "va'
    assert [r["id"] for r in whole_records(text)] == ["a"]
    assert [r["id"] for r in whole_records('[{"id": "a"}, {"id": "b"}]')] == ["a", "b"]


def test_bundled_conversations_are_the_repository_prompts_as_user_turns():
    first = next(conversations("bundled", ROOT))
    assert len(first) == 1 and first[0]["role"] == "user" and first[0]["content"]


def test_an_unknown_source_names_the_choices():
    with pytest.raises(ValueError, match="one of sharegpt, chitchat, bundled"):
        conversations("wiki")
