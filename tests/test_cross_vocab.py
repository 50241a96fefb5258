"""Drafts with another tokenizer (specdec.draft.cross_vocab): token-level intersection (TLI) and string-level
candidates keep the target's distribution under sampling (chi-square at temperatures 0.5, 1 and 1.5 with top-k
and top-p, on tiny models whose vocabularies only partly overlap), the test rejects TLI without its
renormalisation, greedy output is the target's (tiny models, and the real Gemma 3 + SmolLM2 pair in
`make test-all`), and bad input gets a clear error."""

from types import SimpleNamespace

import pytest
import torch
from goodness_of_fit import N_SAMPLES, PASS, REJECT, chi_square_pvalue, sample_counts
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from specdec import GREEDY, Sampling, autoregressive_generate, speculative_generate
from specdec.draft.cross_vocab import StringDrafter, TokenIntersectionDrafter
from specdec.draft.vocab import shared_tokens, token_text, token_texts
from specdec.exact import sequence_distribution
from specdec.runtime.tiny import tiny_model


def toy_tokenizer(vocab: list[str], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over plain characters (no spaces, no special tokens), decoded by joining tokens."""
    model = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(vocab)}, merges=merges))
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=model)


# The target writes a, b, c and "ab"; the draft a, b, c, "ca" and "bb": three tokens shared by text, and
# each side has one the other lacks, so TLI drops draft mass and string-level candidates re-tokenize.
TARGET_VOCAB, DRAFT_VOCAB = ["a", "b", "c", "ab"], ["a", "b", "c", "ca", "bb"]
PROMPT = torch.tensor([[0, 1, 2, 3]])  # "abcab" in target tokens
N_TOKENS = 3


@pytest.fixture(scope="module")
def cross_pair():
    target_tokenizer = toy_tokenizer(TARGET_VOCAB, [("a", "b")])
    draft_tokenizer = toy_tokenizer(DRAFT_VOCAB, [("c", "a"), ("b", "b")])
    target = tiny_model("llama", seed=0, scale=6.0, vocab_size=len(TARGET_VOCAB), n_layers=1)
    draft = tiny_model("llama", seed=3, scale=6.0, vocab_size=len(DRAFT_VOCAB), n_layers=1)
    return target, draft, target_tokenizer, draft_tokenizer


DRAFTERS = {"tli": TokenIntersectionDrafter, "string": StringDrafter}
SAMPLINGS = {
    "T1": Sampling(1.0),
    "T0.5": Sampling(0.5),
    "T1.5": Sampling(1.5),
    "top_k2": Sampling(1.0, top_k=2),
    "top_p0.8": Sampling(1.0, top_p=0.8),
}
CASES = [
    pytest.param(method, sampling, id=f"{method}-{name}",
                 marks=() if (method, name) == ("tli", "T1") else pytest.mark.exhaustive)  # make test: one
    # drafter at T = 1 (the string drafter's greedy output is in tests/test_greedy_matrix.py)
    for method in DRAFTERS
    for name, sampling in SAMPLINGS.items()
]


def counts(pair, drafter, sampling, seed=7, k=2):
    target = pair[0]

    def generate(g):
        return speculative_generate(target, drafter, PROMPT, k=k, sampling=sampling, max_new_tokens=N_TOKENS,
                                    generator=g).tokens  # fmt: skip

    return sample_counts(generate, len(TARGET_VOCAB), N_TOKENS, seed=seed, n=N_SAMPLES)


@pytest.mark.parametrize("method, sampling", CASES)
def test_cross_vocabulary_draft_keeps_the_target_distribution(cross_pair, method, sampling):
    """N_SAMPLES continuations of the loop with the cross-vocabulary drafter fit the target's exact distribution
    (enumerated), and drafts were accepted (the draft really took part)."""
    target, draft, target_tokenizer, draft_tokenizer = cross_pair
    drafter = DRAFTERS[method](draft, draft_tokenizer, target_tokenizer)
    assert chi_square_pvalue(counts(cross_pair, drafter, sampling), sequence_distribution(target, PROMPT, N_TOKENS,
                                                                                         sampling)) > PASS  # fmt: skip
    out = speculative_generate(target, drafter, PROMPT, k=2, sampling=sampling, max_new_tokens=8,
                               generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert out.stats.drafted > 0


def test_chi_square_rejects_tli_without_renormalisation(cross_pair):
    """q restricted to the shared tokens but not renormalised: the rule divides by too small a q and accepts too
    often; the same test rejects it."""
    target, draft, target_tokenizer, draft_tokenizer = cross_pair
    wrong = TokenIntersectionDrafter(draft, draft_tokenizer, target_tokenizer, renormalise=False)
    sampling = Sampling(1.0)
    assert chi_square_pvalue(counts(cross_pair, wrong, sampling, k=3), sequence_distribution(target, PROMPT, N_TOKENS,
                                                                                            sampling)) < REJECT  # fmt: skip


def test_tli_restricts_and_renormalises_q_over_the_shared_tokens(cross_pair):
    _, draft, target_tokenizer, draft_tokenizer = cross_pair
    drafter = TokenIntersectionDrafter(draft, draft_tokenizer, target_tokenizer)
    q = torch.tensor([0.1, 0.2, 0.1, 0.4, 0.2])  # draft tokens a, b, c, "ca", "bb"
    torch.testing.assert_close(drafter.restricted(q, 4), torch.tensor([0.25, 0.5, 0.25, 0.0]))  # a, b, c, "ab"


def test_string_candidates_never_change_accepted_tokens(cross_pair):
    """The draft writes "bb" after a sequence ending in "a": tokenized after the tail, "a" + "bb" would merge into
    "ab" (changing the accepted "a"), so the candidates are "bb" tokenized alone: b, b."""
    _, draft, target_tokenizer, draft_tokenizer = cross_pair
    drafter = StringDrafter(draft, draft_tokenizer, target_tokenizer)
    assert drafter.candidates(torch.tensor([[2, 0]]), [4]) == [1, 1]  # "ca" + "bb": not "c", "ab", "b"
    assert drafter.candidates(torch.tensor([[3]]), [2, 0]) == [2, 0]  # "ab" + "ca": c, a


def test_token_texts_read_byte_level_and_sentencepiece_entries():
    assert token_text("Ġworld", byte_level=True) == " world" and token_text("Ċ", byte_level=True) == "\n"
    assert token_text("ĠâĢ", byte_level=True) is None  # a lone part of a multi-byte character
    assert token_text("▁world", byte_level=False) == " world" and token_text("<0x41>", byte_level=False) == "A"


def test_bad_input_is_refused(cross_pair):
    _, draft, target_tokenizer, _ = cross_pair
    unrelated = toy_tokenizer(["x", "y", "z", "w", "v"], [])
    with pytest.raises(ValueError, match="shares no token"):
        TokenIntersectionDrafter(draft, unrelated, target_tokenizer)
    with pytest.raises(ValueError, match="shares no token"):
        StringDrafter(draft, unrelated, target_tokenizer)
    with pytest.raises(TypeError, match="has no vocabulary"):
        token_texts(SimpleNamespace())
    for cls in DRAFTERS.values():
        with pytest.raises(ValueError, match="cannot read the target's KV cache"):
            cls(draft, unrelated, target_tokenizer, reads_target_cache=True)


@pytest.mark.slow
@pytest.mark.exhaustive  # Gemma 3 270M and SmolLM2-135M, real weights: `make test-all`
def test_gemma3_target_with_the_smollm2_draft_greedy_equals_target_greedy(gemma3, smollm2):
    target, gemma_tokenizer, _ = gemma3
    draft, smollm_tokenizer, _ = smollm2
    assert shared_tokens(smollm_tokenizer, gemma_tokenizer).size > 40_000  # of SmolLM2's 49,152
    ids = gemma_tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    reference = autoregressive_generate(target, ids, sampling=GREEDY, max_new_tokens=24).tokens
    for cls in DRAFTERS.values():
        out = speculative_generate(target, cls(draft, smollm_tokenizer, gemma_tokenizer), ids, k=3, sampling=GREEDY,
                                   max_new_tokens=24)  # fmt: skip
        assert torch.equal(out.tokens, reference), cls.__name__
        assert out.stats.accepted > 0, cls.__name__


def test_the_article_method_across_vocabularies_returns_the_draft_text(cross_pair):
    """draft_then_score with two vocabularies: the draft writes from the prompt's text in its own tokens, and the
    output is that text in the target's tokens, up to the budget (the draft's text, whatever the target thinks of
    it)."""
    from specdec import draft_then_score
    from specdec.naive import draft_prompt

    target, draft, target_tokenizer, draft_tokenizer = cross_pair
    out = draft_then_score(target, draft, PROMPT, sampling=GREEDY, max_new_tokens=6, draft_tokenizer=draft_tokenizer,
                           target_tokenizer=target_tokenizer)  # fmt: skip
    alone = autoregressive_generate(draft, draft_prompt(PROMPT, draft_tokenizer, target_tokenizer), sampling=GREEDY,
                                    max_new_tokens=6).tokens  # fmt: skip
    text = draft_tokenizer.decode(alone.tolist())
    in_target_tokens = target_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert out.tokens.tolist() == in_target_tokens[:6]  # the draft's text, cut to the budget in target tokens
    assert int(out.tokens.max()) < len(TARGET_VOCAB) and "article_log_likelihood" in out.stats.extras


def test_a_string_drafter_in_a_batch_is_refused_with_its_own_message(cross_pair):
    """A StringDrafter keeps per-sequence state (the draft's view of the text): a batch names that and the fix,
    not a DraftSwitch's message."""
    target, draft, target_tokenizer, draft_tokenizer = cross_pair
    drafter = StringDrafter(draft, draft_tokenizer, target_tokenizer)
    with pytest.raises(ValueError, match="StringDrafter cannot draft for a batch.*batch_size=1"):
        speculative_generate(target, drafter, [[0, 1], [2, 3]], k=2, sampling=GREEDY, max_new_tokens=2)


@pytest.mark.parametrize("context_tokens", [0, -1, 1.5, True])
def test_string_drafter_context_is_checked(cross_pair, context_tokens):
    """context_tokens=0 used to mean the whole sequence, silently; now anything but an int >= 1 is refused."""
    _, draft, target_tokenizer, draft_tokenizer = cross_pair
    with pytest.raises(ValueError, match="context_tokens .* must be an int >= 1"):
        StringDrafter(draft, draft_tokenizer, target_tokenizer, context_tokens=context_tokens)


def test_a_run_lists_the_compiled_runtime_of_a_cross_vocabulary_pair(cross_pair):
    """The compiled runtimes of a string-level pair (whose `candidates` is a method, not a DraftSwitch's dict), as a
    run records them: the compiled target is listed, and the eager draft is not (it crashed the run's end before)."""
    from specdec.auto.runtime import compiled_runtimes
    from specdec.runtime.compiled import compile_model, eager_model

    _, draft, target_tokenizer, draft_tokenizer = cross_pair
    target = tiny_model("llama", seed=0, vocab_size=len(TARGET_VOCAB), n_layers=1)
    runtime = compile_model(target)  # lazy: nothing compiles until a pass runs
    try:
        for drafter in DRAFTERS.values():
            assert compiled_runtimes(target, drafter(draft, draft_tokenizer, target_tokenizer)) == {"target": runtime}
    finally:
        eager_model(target)
