"""Teacher data from conversations (specdec.train.data) and the training loop's schedule (specdec.train.loop)."""

import pytest
import torch

from specdec.train.data import encode
from specdec.train.loop import TrainSettings, learning_rate


def test_a_conversation_marks_the_assistants_tokens(smollm2):
    """encode: the tokens marked as answers are the assistant turns' text and closing tokens, nothing of the user's
    turns or the template's headers; max_tokens cuts ids and marks alike."""
    turns = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue is one."},
             {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green."}]
    tokenizer = smollm2[1]
    ids, is_answer = encode(tokenizer, turns)
    answer = tokenizer.decode(ids[is_answer])
    assert "Blue is one." in answer and "Green." in answer
    assert "colour" not in answer and "Another" not in answer and "assistant" not in answer
    cut_ids, cut_answer = encode(tokenizer, turns, max_tokens=10)
    assert torch.equal(cut_ids, ids[:10]) and torch.equal(cut_answer, is_answer[:10])


def test_the_learning_rate_warms_up_then_decays_to_a_tenth():
    s = TrainSettings(steps=110, lr=1.0, warmup=10)
    assert learning_rate(s, 0) == pytest.approx(0.1) and learning_rate(s, 9) == pytest.approx(1.0)
    assert learning_rate(s, 10) == pytest.approx(1.0) and learning_rate(s, 110) == pytest.approx(0.1)
