"""The trained draft head (specdec.draft.head): exact with a reduced vocabulary, reading the right features, and
trainable.

- Greedy output equals the target's on every tiny architecture, one row and a batch.
- Chi-square with power on the 5-token pair: the head with a 3-token draft vocabulary keeps the target's
  distribution; a deliberately wrong variant (samples from the subset, reports the full-vocabulary softmax as q)
  is rejected by the same test.
- The target's features follow its cache slots (crops, tree compaction, batch rows), and the head's incremental
  drafting equals a recomputation from scratch.
- A few training steps on a tiny target raise its acceptance; save and load keep the head.
"""

import copy
from dataclasses import replace

import pytest
import torch
from fakes import GREEDY_PROMPT
from goodness_of_fit import PASS, REJECT, batch_counts, chi_square_pvalue, sample_counts

from specdec import (
    GREEDY,
    ModelTreeDrafter,
    Sampling,
    TraversalVerification,
    TreeRules,
    autoregressive_generate,
    speculative_generate,
    tree_generate,
)
from specdec.draft.head import DraftHead, frequency_ranked, load_head, save_head
from specdec.draft.head_drafter import HeadDrafter, HeadTreeDrafter
from specdec.exact import sequence_distribution
from specdec.runtime.cached import CachedLM
from specdec.runtime.tiny import perturbed_copy, tiny_model
from specdec.sampling import probabilities
from specdec.train.head import (
    answer_positions,
    chunked,
    first_token_acceptance,
    head_loss,
    restricted_labels,
    target_side,
    teacher_pass,
)

PROMPT = torch.tensor([[0, 3, 1]])
N_TOKENS = 3


def random_head(target, vocab=None, seed=0) -> DraftHead:
    torch.manual_seed(seed)
    return DraftHead(target, layers=1, vocab=vocab)


def test_head_greedy_in_a_batch_equals_each_row_alone(trained_tiny):
    target, head = trained_tiny
    prompts = [GREEDY_PROMPT[0], GREEDY_PROMPT[0, :2], torch.tensor([4, 9, 4, 9, 4])]
    out = speculative_generate(target, HeadDrafter(head), prompts, k=3, sampling=GREEDY, max_new_tokens=12)
    for b, prompt in enumerate(prompts):
        alone = autoregressive_generate(target, prompt[None], sampling=GREEDY, max_new_tokens=12).tokens
        assert torch.equal(out[b].tokens, alone)
    assert out.stats.accepted > 0  # the trained head's drafts are accepted in part: rollback and catch-up run


class FullSoftmaxHead(HeadDrafter):
    """Wrong on purpose: samples from the subset S but reports q = softmax(W f^) over the whole vocabulary."""

    def propose_row(self, sequence, k, sampling, vocab_size, generator):
        draft = super().propose_row(sequence, k, sampling, vocab_size, generator)
        wrong = torch.stack([probabilities(self.full_logits[i], sampling) for i in range(draft.size)])
        return type(draft)(draft.tokens, wrong, draft.forwards)

    def catch_up(self, features, tokens, cached):
        predicted, logits = super().catch_up(features, tokens, cached)
        self.full_logits = [predicted[0] @ self.head.whole_output.T]
        return predicted, logits

    def step(self, predicted, token, position):
        predicted, logits = super().step(predicted, token, position)
        self.full_logits.append(predicted[0] @ self.head.whole_output.T)
        return predicted, logits


def head_counts(target, drafter, sampling, k, seed, rows=True):
    """Counts of N_SAMPLES continuations: the rows of one batch, or one generation after another (rows=False)."""
    def generate(g, n=1):
        return speculative_generate(target, drafter, PROMPT.expand(n, -1), k=k, sampling=sampling,
                                    max_new_tokens=N_TOKENS, generator=g).tokens

    if rows:
        return batch_counts(generate, 5, N_TOKENS, seed=seed)
    return sample_counts(generate, 5, N_TOKENS, seed=seed)


@pytest.mark.parametrize("sampling", [Sampling(1.0), pytest.param(Sampling(0.7, top_p=0.9), marks=pytest.mark.exhaustive)],
                         ids=["T1", "T0.7-top_p0.9"])
def test_head_with_a_reduced_vocabulary_keeps_the_target_distribution(small_vocab_pair, sampling):
    target, _ = small_vocab_pair
    head = random_head(target, vocab=torch.tensor([3, 0, 2]))
    counts = head_counts(target, HeadDrafter(head), sampling, 2, seed=5)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS


def test_full_softmax_in_the_ratio_is_caught(small_vocab_pair):
    target, _ = small_vocab_pair
    head = random_head(target, vocab=torch.tensor([3, 0, 2]))
    head.whole_output = target.get_output_embeddings().weight.detach()  # W: the whole output layer
    sampling = Sampling(1.0)
    counts = head_counts(target, FullSoftmaxHead(head), sampling, 2, seed=5, rows=False)  # its q is row 0's
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) < REJECT


def fresh_features(target, tokens: torch.Tensor) -> torch.Tensor:
    """The target's features over tokens (L,), from one pass of a new cache."""
    return teacher_pass(target, tokens)[0]


def test_features_follow_the_cache_through_chains_batches_and_trees():
    target = tiny_model("llama", seed=0, scale=20.0)
    head = random_head(target)
    lm = CachedLM(target)
    prompts = [GREEDY_PROMPT[0], torch.tensor([2, 7, 2, 7])]
    out = speculative_generate(target, HeadDrafter(head), prompts, k=3, sampling=Sampling(1.0), max_new_tokens=9,
                               generator=torch.Generator().manual_seed(0), cache=lm)
    for b, features in enumerate(lm.row_features()):
        sequence = torch.cat([prompts[b], out[b].tokens])
        torch.testing.assert_close(features, fresh_features(target, sequence)[: features.shape[0]])
    lm = CachedLM(target)
    lm.keep_features()
    drafter = ModelTreeDrafter(perturbed_copy(target, 0.3), branches=(2, 2), depth=3)
    out = tree_generate(target, drafter, GREEDY_PROMPT, sampling=Sampling(1.0), max_new_tokens=12, cache=lm,
                        generator=torch.Generator().manual_seed(0))
    sequence = torch.cat([GREEDY_PROMPT[0], out.tokens])
    assert out.stats.accepted > 0  # a tree's accepted path was compacted into the cache
    torch.testing.assert_close(lm.row_features()[0], fresh_features(target, sequence)[: sequence.numel() - 1])


class Recording(HeadDrafter):
    def propose_row(self, sequence, k, sampling, vocab_size, generator):
        draft = super().propose_row(sequence, k, sampling, vocab_size, generator)
        self.log.append((sequence[0].clone(), draft.q[:1].clone()))
        return draft


def test_incremental_drafting_equals_recomputation(trained_tiny):
    """The head's first q of every round equals the head run from scratch over fresh target features."""
    target, head = trained_tiny
    drafter = Recording(head)
    drafter.log = []
    speculative_generate(target, drafter, GREEDY_PROMPT, k=3, sampling=Sampling(1.0), max_new_tokens=15,
                         generator=torch.Generator().manual_seed(1))
    assert len(drafter.log) >= 3
    for sequence, q in drafter.log:
        features = fresh_features(target, sequence)[:-1]  # every position but the last
        positions = torch.arange(features.shape[0])[None]
        with torch.no_grad():
            predicted = head(features[None], sequence[None, 1:], positions)[:, -1]
        torch.testing.assert_close(probabilities(head.logits(predicted), Sampling(1.0)), q, atol=1e-5, rtol=1e-4)


def test_training_raises_acceptance_and_the_head_saves_and_loads(trained_tiny, tmp_path):
    target, head = trained_tiny
    assert head.trained_alpha > head.untrained_alpha + 0.1
    loaded = load_head(save_head(head, tmp_path).parent, target)
    features = torch.randn(1, 4, target.config.hidden_size)
    tokens, positions = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, tokens, positions), head(features, tokens, positions))
    assert torch.equal(loaded.vocab, head.vocab)


def test_a_head_loads_onto_a_bfloat16_copy_of_its_target(trained_tiny, tmp_path):
    """A head trained on the float32 target drafts for a bf16 copy of it: loaded in the target's dtype."""
    target, head = trained_tiny
    bf16 = copy.deepcopy(target).to(torch.bfloat16)
    loaded = load_head(save_head(head, tmp_path).parent, bf16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    prompt = torch.tensor([[1, 2, 3, 4]])
    out = speculative_generate(bf16, HeadDrafter(loaded), prompt, k=2, sampling=GREEDY, max_new_tokens=8)
    assert out.tokens.numel() == 8


def test_restricted_labels_keep_the_teachers_mass_on_the_subset():
    target = tiny_model("llama", seed=0, vocab_size=6)
    head = random_head(target, vocab=torch.tensor([4, 1]))
    ids, probs = torch.tensor([[1, 2, 4]]), torch.tensor([[0.5, 0.3, 0.1]])
    torch.testing.assert_close(restricted_labels(head, ids, probs), torch.tensor([[0.1, 0.5]]))
    assert frequency_ranked(torch.tensor([3, 9, 0, 5]), 2).tolist() == [1, 3]
    assert frequency_ranked(torch.tensor([3, 9]), 8) is None


def test_bad_draft_vocabularies_are_refused():
    target = tiny_model("llama", seed=0, vocab_size=6)
    for vocab in (torch.tensor([1, 1]), torch.tensor([7]), torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError, match="distinct token ids below 6"):
            DraftHead(target, vocab=vocab)


@pytest.fixture(scope="module")
def trained_tiny():
    """A tiny llama target and a head trained for 150 steps on its own greedy continuations of random prompts."""
    target = tiny_model("llama", seed=0, scale=20.0)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(24):
        prompt = torch.randint(32, (1, 4), generator=generator)
        text = torch.cat([prompt[0], autoregressive_generate(target, prompt, sampling=Sampling(1.0), max_new_tokens=28,
                                                             generator=generator).tokens])
        rows.append((text, *teacher_pass(target, text)))
    train, validation = chunked(rows, 16).split(8)
    head = random_head(target, vocab=frequency_ranked(torch.bincount(train.tokens.flatten(), minlength=32), 24))
    untrained = first_token_acceptance(head, validation.batch(slice(None)), target.get_output_embeddings().weight)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(150):
        head.train()
        loss, _ = head_loss(head, train.batch(torch.randint(len(train), (8,), generator=generator)), ce_weight=1.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = first_token_acceptance(head, validation.batch(slice(None)), target.get_output_embeddings().weight)
    head.untrained_alpha, head.trained_alpha = untrained["alpha"], trained["alpha"]
    return target, head.eval()


@pytest.mark.exhaustive
@pytest.mark.parametrize("children, rule", [("iid", TraversalVerification), ("top", TreeRules)])
def test_head_tree_with_a_reduced_vocabulary_keeps_the_target_distribution(small_vocab_pair, children, rule):
    target, _ = small_vocab_pair
    drafter = HeadTreeDrafter(random_head(target, vocab=torch.tensor([3, 0, 2])), branches=(2,), depth=2, nodes=3,
                              children=children)
    sampling = Sampling(1.0)

    def generate(g, n):
        return tree_generate(target, drafter, PROMPT.expand(n, -1), sampling=sampling,
                             max_new_tokens=N_TOKENS, generator=g, acceptance=rule()).tokens

    counts = batch_counts(generate, 5, N_TOKENS, seed=7)
    assert chi_square_pvalue(counts, sequence_distribution(target, PROMPT, N_TOKENS, sampling)) > PASS


def test_head_tree_paths_equal_the_chain_drafts(trained_tiny):
    """A one-child-per-node tree of the head is the head's greedy chain: the same tokens, rounds and acceptances."""
    target, head = trained_tiny
    chain = speculative_generate(target, HeadDrafter(head), GREEDY_PROMPT, k=3, sampling=GREEDY, max_new_tokens=15)
    tree = tree_generate(target, HeadTreeDrafter(head, branches=(1,), depth=3, nodes=3), GREEDY_PROMPT,
                         sampling=GREEDY, max_new_tokens=15)
    assert torch.equal(tree.tokens, chain.tokens)
    assert tree.stats.accepted == chain.stats.accepted > 0


def test_the_answer_mask_limits_the_loss_and_the_validation_to_answer_positions():
    """answers_only: the loss moves with the teacher's labels at answer positions only, equals the unmasked loss when
    every position is an answer, and the validation adds the acceptance over the answer positions."""
    target = tiny_model("llama", seed=0)
    rows = []
    for seed in range(2):
        text = torch.randint(32, (16,), generator=torch.Generator().manual_seed(seed))
        is_answer = torch.arange(16) >= 6  # a 6-token prompt, then the answer
        rows.append((text, *teacher_pass(target, text), answer_positions(is_answer)))
    batch = chunked(rows, 16).batch(slice(None))
    assert batch.answer[:, :5].sum() == 0 and batch.answer[:, 5:15].all() and batch.answer[:, 15].sum() == 0
    head = random_head(target, vocab=None)
    with torch.no_grad():
        masked = head_loss(head, batch, ce_weight=1.0, answers_only=True)[0]
        prompt_changed = replace(batch, top_probs=batch.top_probs.clone())
        prompt_changed.top_probs[:, :5] = prompt_changed.top_probs[:, :5].flip(-1)
        assert torch.equal(head_loss(head, prompt_changed, ce_weight=1.0, answers_only=True)[0], masked)
        assert not torch.equal(head_loss(head, prompt_changed, ce_weight=1.0)[0], head_loss(head, batch, ce_weight=1.0)[0])
        answer_changed = replace(batch, top_probs=batch.top_probs.clone())
        answer_changed.top_probs[:, 8:] = answer_changed.top_probs[:, 8:].flip(-1)
        assert not torch.equal(head_loss(head, answer_changed, ce_weight=1.0, answers_only=True)[0], masked)
        everything = replace(batch, answer=torch.ones_like(batch.answer))
        torch.testing.assert_close(head_loss(head, everything, ce_weight=1.0, answers_only=True)[0],
                                   head_loss(head, batch, ce_weight=1.0)[0])
    with pytest.raises(ValueError, match="marks the answers"):
        head_loss(head, replace(batch, answer=None), answers_only=True)
    scores = first_token_acceptance(head, batch, target.get_output_embeddings().weight)
    assert scores["answer_positions"] == 20 and 0 <= scores["answer_alpha"] <= 1


def test_the_validation_on_the_draft_vocabulary_equals_the_whole_vocabulary_formula():
    """alpha = E[sum_x min(p(x), q(x))] and the greedy match computed on S (q is 0 outside it), with the target's side
    computed on the spot or once beforehand (TargetSide), equal the formula over the whole vocabulary."""
    target = tiny_model("llama", seed=0)
    rows = [(text, *teacher_pass(target, text))
            for text in (torch.randint(32, (16,), generator=torch.Generator().manual_seed(s)) for s in range(3))]
    batch = chunked(rows, 16).batch(slice(None))
    head = random_head(target, vocab=torch.tensor([5, 1, 30, 2, 7, 11, 0, 3]))
    weight = target.get_output_embeddings().weight
    with torch.no_grad():
        width = batch.tokens.shape[1] - 1
        positions = torch.arange(width)[None].expand(len(batch), -1)
        draft_logits = head.logits(head(batch.features[:, :-1], batch.tokens[:, 1:], positions))  # (B, T-1, V)
        target_logits = batch.features[:, 1:] @ weight.T
        alpha = torch.minimum(target_logits.softmax(-1), draft_logits.softmax(-1)).sum(-1).mean()
        match = (draft_logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    side = target_side(head, batch, weight)
    for scores in (first_token_acceptance(head, batch, weight), first_token_acceptance(head, batch, None, target=side)):
        assert scores["alpha"] == pytest.approx(float(alpha), abs=1e-6)
        assert scores["greedy_match"] == pytest.approx(float(match))
    assert 0 < float(alpha) < 1 and side.p_on_s.shape == (3, 15, 8)
