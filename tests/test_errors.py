"""Bad input gets a clear error that names the fix."""

import pytest
import torch

from specdec import (
    GREEDY,
    ModelDrafter,
    NGramDrafter,
    Sampling,
    autoregressive_generate,
    speculative_generate,
)
from specdec.runtime.models import (
    check_tokenizers,
    draft_tokenizer,
    layer_truncated_copy,
    load_model,
    quantization_config,
    resolve,
)
from specdec.runtime.tiny import tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


def spec(target, ids, **kw):
    args = {"k": 3, "sampling": GREEDY, "max_new_tokens": 4} | kw
    return speculative_generate(target, ModelDrafter(target), ids, **args)


def test_k_below_one(target):
    with pytest.raises(ValueError, match="k .*>= 1"):
        spec(target, torch.tensor([[1, 2]]), k=0)


def test_negative_temperature():
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        Sampling(temperature=-1.0)


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01])
def test_top_p_out_of_range(top_p):
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        Sampling(top_p=top_p)


def test_empty_prompt(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        spec(target, torch.zeros(1, 0, dtype=torch.long))


def test_batch_larger_than_one_decodes_every_row(target):
    """(B, L) input is a batch (specdec.state): one output per row, each the row's own (tests/test_batch.py)."""
    ids = torch.tensor([[1, 2], [3, 4]])
    out = spec(target, ids)
    alone = [spec(target, row[None]).tokens for row in ids]
    assert len(out) == 2 and all(torch.equal(a, b) for a, b in zip(out.tokens, alone))
    assert len(autoregressive_generate(target, ids, max_new_tokens=3).tokens) == 2


def test_prompt_longer_than_context(target):
    limit = target.config.max_position_embeddings
    with pytest.raises(ValueError, match="context is 256: shorten it"):
        spec(target, torch.ones(1, limit, dtype=torch.long))
    with pytest.raises(ValueError, match="lower max_new_tokens to at most 6"):
        spec(target, torch.ones(1, limit - 6, dtype=torch.long), max_new_tokens=10)


def test_max_new_tokens_below_one(target):
    with pytest.raises(ValueError, match="max_new_tokens"):
        spec(target, torch.tensor([[1]]), max_new_tokens=0)


def test_one_token_prompt_works(target):
    out = speculative_generate(target, NGramDrafter(), torch.tensor([[1]]), k=2, sampling=GREEDY, max_new_tokens=5)
    assert out.tokens.numel() == 5


def test_mismatched_tokenizers_named(monkeypatch):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as word_models
    from transformers import PreTrainedTokenizerFast

    from specdec.runtime import models

    def tok(words):
        t = Tokenizer(word_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        return PreTrainedTokenizerFast(tokenizer_object=t)

    check_tokenizers(tok(["<unk>", "a", "b"]), tok(["<unk>", "a", "b"]), "t", "d")
    with pytest.raises(ValueError, match="'big/model'.*'small/model'.*same tokenizer"):
        check_tokenizers(tok(["<unk>", "a", "b"]), tok(["<unk>", "b", "a"]), "big/model", "small/model")
    target = tok(["<unk>", "a", "b"])  # a draft model's tokenizer: the target's for a copy, else its own, checked
    assert draft_tokenizer(target, "t", None) is target and draft_tokenizer(target, "t", "t") is target
    monkeypatch.setattr(models, "load_tokenizer", lambda name: tok(["<unk>", "b", "a"]))
    with pytest.raises(ValueError, match="'t'.*'small/model'.*same tokenizer"):
        draft_tokenizer(target, "t", "small/model")


def test_unknown_quantization_lists_choices():
    with pytest.raises(ValueError, match="choices: .*nf4"):
        quantization_config("int3", torch.float32)


def test_unknown_dtype_lists_choices():
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        load_model("offline:smollm2-135m-instruct", dtype="float8")


def test_unknown_offline_asset():
    with pytest.raises(ValueError, match="unknown offline model.*choices"):
        resolve("offline:gpt-5")


def test_missing_local_model_says_what_to_do(tmp_path):
    with pytest.raises(OSError, match="offline asset"):
        load_model(str(tmp_path / "nowhere"))


def test_layer_truncated_copy_bounds(target):
    assert len(layer_truncated_copy(target, 1).model.layers) == 1
    with pytest.raises(ValueError, match="n_layers"):
        layer_truncated_copy(target, 2)


def test_k_max_is_refused_with_a_fixed_k(target):
    """k_max bounds what k='auto' chooses; with a fixed k it would be silently ignored, so it is refused."""
    with pytest.raises(ValueError, match="k_max=2 bounds the draft length k='auto' chooses; with k=3 leave it out"):
        spec(target, torch.tensor([[1, 2]]), k_max=2)
    with pytest.raises(ValueError, match="k_max .* must be an int >= 1, got 0"):
        spec(target, torch.tensor([[1, 2]]), k="auto", k_max=0)


def test_a_draft_switch_with_trees_and_k_auto_is_refused(target):
    """tree_generate(k='auto') cannot switch drafts (the online choice prices chains): refused, not ignored."""
    from specdec import DraftSwitch, NGramTreeDrafter, tree_generate

    switch = DraftSwitch({"a": NGramTreeDrafter(), "b": NGramTreeDrafter(max_ngram=2)})
    with pytest.raises(ValueError, match="k='auto' with a DraftSwitch chooses a chain draft for one sequence"):
        tree_generate(target, switch, torch.tensor([[1, 2, 1, 2]]), k="auto")


def test_a_given_cache_is_used_for_a_batch_too(target):
    """cache= holds the batch's rows (it was silently ignored for several prompts): filled after the call, and
    refused when it is not empty."""
    from specdec.runtime.cached import CachedLM

    cache = CachedLM(target)
    out = spec(target, [[1, 2, 3], [4, 5]], cache=cache, max_new_tokens=3)
    assert cache.rows == len(out) == 2 and cache.slots > 0
    with pytest.raises(ValueError, match="cache must be an empty CachedLM"):
        spec(target, [[1, 2, 3], [4, 5]], cache=cache)
