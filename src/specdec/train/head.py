"""Training a draft head (specdec.draft.head) by distillation from the target, as EAGLE does (Li et al. 2024).

Teacher data. One teacher-forced target pass over a token row x_0..x_{L-1} gives its features f_i and its
distribution p_i over the token after position i (p_i = softmax(W f_i)); `teacher_pass` keeps the features and the
top-k of each p_i (the labels are the target's distribution, not the text's tokens).

Loss at position i (the head reads (f_i, x_{i+1}) and predicts f^_{i+1}):
    smooth_l1(f^_{i+1}, f_{i+1})  +  ce_weight * H(p_{i+1} restricted to top-k, q_{i+1})     q = softmax(W_S f^)
`unroll` > 1 also trains later drafting steps, where the head reads its own predictions: step s reads
(f^_{i+s-1}, x_{i+s}) and predicts f_{i+s}. Here every earlier position of step s is a prediction too (a
simplification of EAGLE-3's training-time test, whose earlier positions keep the true features).

Answers: a conversation's tokens are the user's and the assistant's, and a draft in decoding only ever proposes
the assistant's. `Teacher.answer` marks the positions whose p_i is over a token of an assistant turn; with
answers_only the loss counts those positions alone (EAGLE's loss mask), and the validation reports the acceptance
there next to the one over every position (`answer_alpha`, `answer_greedy_match`).

Validation: the acceptance rate of the first draft token, alpha = E[sum_x min(p(x), q(x))] at temperature 1 (with
p computed in full from the stored features) and the greedy match rate P(argmax q = argmax p).
`confidence_counts` bins the positions by the head's confidence max_x q(x) and counts the greedy matches in each
bin: how well confidence predicts acceptance (what HeadDrafter's `confidence` stop relies on).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..draft.head import DraftHead
from ..runtime.cached import CachedLM


@dataclass
class Teacher:
    """What the target computed over token rows, chunked to equal lengths T: tokens (n, T), features (n, T, d),
    the top-k of each position's p: ids (n, T, K) and probabilities (n, T, K), and answer (n, T): whether p at that
    position is over a token of an assistant turn (None: not known, every position counts)."""

    tokens: torch.Tensor
    features: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    answer: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def part(self, index: torch.Tensor | slice) -> Teacher:
        answer = None if self.answer is None else self.answer[index]
        return Teacher(self.tokens[index], self.features[index], self.top_ids[index], self.top_probs[index], answer)

    def batch(self, index: torch.Tensor | slice) -> Teacher:
        """The chunks `index`, features and probabilities in float32 (stored in float16)."""
        part = self.part(index)
        return Teacher(part.tokens, part.features.float(), part.top_ids, part.top_probs.float(), part.answer)

    def split(self, validation: int) -> tuple[Teacher, Teacher]:
        """(training, validation): the last `validation` chunks held out."""
        cut = len(self) - validation
        return self.part(slice(0, cut)), self.part(slice(cut, None))

    def held_out(self, share: float) -> tuple[Teacher, Teacher]:
        """(training, validation) with `share` of the chunks (at least one) held out at the end."""
        return self.split(max(1, round(share * len(self))))


@torch.inference_mode()
def teacher_pass(target: PreTrainedModel, tokens: torch.Tensor, top_k: int = 8
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One teacher-forced pass over tokens (L,): features (L, d) and the top-k ids and probabilities (L, K) of p."""
    lm = CachedLM(target)
    lm.keep_features()
    logits = lm.forward(tokens[None].to(lm.device))[0]  # (L, V)
    probs, ids = logits.float().softmax(dim=-1).topk(top_k, dim=-1)  # (L, K)
    return lm.row_features()[0], ids, probs


def chunked(rows: list[tuple[torch.Tensor, ...]], length: int) -> Teacher:
    """Each row's (tokens, features, ids, probs) or (tokens, features, ids, probs, answer) cut into whole chunks of
    `length` positions (a row shorter than one chunk is dropped); features and probabilities stored in float16."""
    parts: list[list[torch.Tensor]] = [[] for _ in rows[0]] if rows else [[], [], [], []]
    for row in rows:
        whole = row[0].shape[0] // length * length
        for part, tensor in zip(parts, row):
            if whole:
                part.append(tensor[:whole].reshape(whole // length, length, *tensor.shape[1:]))
    if not parts[0]:
        raise ValueError(f"no token row holds a chunk of {length} tokens: use shorter chunks or longer rows")
    tokens, features, ids, probs, *answer = (torch.cat(p) for p in parts)
    return Teacher(tokens, features.half(), ids, probs.half(), answer[0].bool() if answer else None)


def answer_positions(is_answer: torch.Tensor) -> torch.Tensor:
    """(L,) whether each token belongs to an assistant turn -> (L,) whether p at each position is over such a token
    (p_i is the distribution of token i + 1; the last position's next token is unknown: False)."""
    return torch.cat([is_answer[1:], is_answer.new_zeros(1)]).bool()


def masked_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean of values (...) over the positions where weights (...) is true (all positions for None)."""
    if weights is None:
        return values.mean()
    weights = weights.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp_min(1)


def restricted_labels(head: DraftHead, ids: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The teacher's top-k mass on W_S's columns: (..., N) with p's top-k probabilities where they fall in S."""
    column = torch.full((head.vocab_size,), -1, dtype=torch.long, device=ids.device)
    column[head.vocab] = torch.arange(head.vocab.numel(), device=ids.device)
    where = column[ids]  # (..., K): the column of each top-k id, -1 outside S
    labels = probs.new_zeros(*ids.shape[:-1], head.vocab.numel())
    return labels.scatter_add_(-1, where.clamp_min(0), probs * (where >= 0))


def head_loss(head: DraftHead, batch: Teacher, ce_weight: float = 0.1, unroll: int = 1, noise: float = 0.0,
              answers_only: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss over a batch of chunks (module docstring) and its parts per step; answers_only: only the
    positions whose next token is an assistant's count (batch.answer)."""
    if answers_only and batch.answer is None:
        raise ValueError("answers_only needs teacher data that marks the answers (Teacher.answer)")
    features = batch.features  # (B, T, d)
    inputs = features[:, :-1] + noise * (torch.rand_like(features[:, :-1]) - 0.5)
    total, parts = 0.0, {}
    for s in range(1, unroll + 1):
        width = inputs.shape[1] - (s - 1)
        positions = torch.arange(s - 1, s - 1 + width, device=features.device)[None].expand(features.shape[0], -1)
        predicted = head(inputs[:, :width], batch.tokens[:, s : s + width], positions)  # (B, width, d)
        weights = batch.answer[:, s : s + width] if answers_only else None
        regression = masked_mean(F.smooth_l1_loss(predicted, features[:, s : s + width], reduction="none").mean(-1),
                                 weights)
        labels = restricted_labels(head, batch.top_ids[:, s : s + width], batch.top_probs[:, s : s + width])
        ce = masked_mean(-(labels * head.subset_logits(predicted).log_softmax(dim=-1)).sum(-1), weights)
        total = total + regression + ce_weight * ce
        parts |= {f"regression_{s}": regression.item(), f"cross_entropy_{s}": ce.item()}
        inputs = predicted[:, :-1]
    return total, parts


def first_token_predictions(head: DraftHead, batch: Teacher) -> torch.Tensor:
    """The head's predicted features f^ (B, T-1, d) of the first draft token at every position of a batch."""
    head.eval()
    width = batch.tokens.shape[1] - 1
    positions = torch.arange(width, device=batch.features.device)[None].expand(len(batch), -1)
    return head(batch.features[:, :-1], batch.tokens[:, 1:], positions)


def target_logits(batch: Teacher, target_weight: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    """The target's logits (B, T-1, V) for the token after each position but the first, from the stored features,
    soft-capped as the target caps them."""
    logits = batch.features[:, 1:] @ target_weight.T
    return torch.tanh(logits / softcap) * softcap if softcap else logits


@dataclass
class TargetSide:
    """The target's half of the validation at every position of a batch, which training does not change: p on the
    head's draft vocabulary S (B, T-1, N) and argmax p (B, T-1). q is 0 outside S, so sum_x min(p(x), q(x)) needs p
    on S alone; computed once, it spares every later validation the target's whole-vocabulary logits."""

    p_on_s: torch.Tensor
    best: torch.Tensor


@torch.no_grad()
def target_side(head: DraftHead, batch: Teacher, target_weight: torch.Tensor, softcap: float | None = None
                ) -> TargetSide:
    """p on S and argmax p at every position of the batch (TargetSide), from its stored features."""
    logits = target_logits(batch, target_weight, softcap)  # (B, T-1, V)
    return TargetSide(logits.softmax(dim=-1)[..., head.vocab], logits.argmax(-1))


@torch.no_grad()
def first_token_acceptance(head: DraftHead, batch: Teacher, target_weight: torch.Tensor,
                           softcap: float | None = None, target: TargetSide | None = None) -> dict[str, float]:
    """alpha (temperature 1) and the greedy match rate of the first draft token over a batch (module docstring);
    target_weight: the target's whole output layer (V, d); target: the batch's TargetSide when computed already."""
    target = target or target_side(head, batch, target_weight, softcap)
    q = head.subset_logits(first_token_predictions(head, batch)).softmax(dim=-1)  # (B, T-1, N): q on S (0 elsewhere)
    overlap = torch.minimum(target.p_on_s, q).sum(-1)  # (B, T-1)
    match = (head.vocab[q.argmax(-1)] == target.best).float()
    out = {"alpha": float(overlap.mean()), "greedy_match": float(match.mean())}
    if batch.answer is not None:
        answer = batch.answer[:, 1:]
        out |= {"answer_alpha": float(masked_mean(overlap, answer)),
                "answer_greedy_match": float(masked_mean(match, answer)), "answer_positions": int(answer.sum())}
    return out


CONFIDENCE_EDGES = tuple(i / 10 for i in range(11))  # bins of width 0.1


@torch.no_grad()
def confidence_counts(head: DraftHead, batch: Teacher, target_weight: torch.Tensor, softcap: float | None = None,
                      edges: tuple[float, ...] = CONFIDENCE_EDGES) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, greedy matches) per confidence bin [edges[j], edges[j+1]) (the last bin closed), over the
    answer positions when the batch marks them, else over every position; confidence: max_x q(x) at temperature 1."""
    confidence, best = head.subset_logits(first_token_predictions(head, batch)).softmax(dim=-1).max(dim=-1)  # (B, T-1)
    match = head.vocab[best] == target_logits(batch, target_weight, softcap).argmax(-1)
    keep = batch.answer[:, 1:].bool() if batch.answer is not None else torch.ones_like(match)
    bins = torch.bucketize(confidence[keep].float(), torch.tensor(edges[1:-1]), right=True)  # (n,) in 0..len-2
    count = torch.bincount(bins, minlength=len(edges) - 1)
    matches = torch.bincount(bins, weights=match[keep].float(), minlength=len(edges) - 1)
    return count, matches
