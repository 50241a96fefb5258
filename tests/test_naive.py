"""The article's draft-then-score: its counters say which model ran, and its output is the draft's."""

import torch

from specdec import GREEDY, autoregressive_generate, draft_then_score
from specdec.runtime.tiny import tiny_model


def test_counters_name_the_model_that_ran():
    target, draft = tiny_model("llama", seed=0), tiny_model("llama", seed=1, n_layers=1)
    prompt = torch.tensor([[1, 2, 3]])
    out = draft_then_score(target, draft, prompt, sampling=GREEDY, max_new_tokens=6)
    alone = autoregressive_generate(draft, prompt, sampling=GREEDY, max_new_tokens=6)
    assert torch.equal(out.tokens, alone.tokens)  # the draft, returned unchanged
    assert out.stats.emitted == 6
    assert out.stats.draft_forwards == 6  # one draft-model pass per new token
    assert out.stats.target_forwards == 1  # the one scoring pass
    assert out.stats.drafted == out.stats.accepted == 0  # nothing is verified
    assert set(out.stats.seconds) == {"draft", "verify", "total"}
    assert "continuation_log_likelihood" in out.stats.extras
