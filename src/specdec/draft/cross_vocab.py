"""Drafts from a model with another tokenizer, exact under sampling (Timor et al., ICML 2025, arXiv 2502.05202).

Notation of Leviathan et al.: p target distribution, q draft distribution, k = gamma draft tokens. Two
drafters for the one loop, both proposing chains of target tokens:

- TokenIntersectionDrafter (TLI): the draft's q restricted to the tokens both vocabularies share (matched by
  text, specdec.draft.vocab) and renormalised, q'(x) = q(x) / sum_{y shared} q(y), a distribution over target
  tokens. x ~ q' is verified with the usual rule min(1, p(x) / q'(x)): exact, since q' is what x was drawn
  from. Drafting stops early when q has no mass on a shared token.
- StringDrafter (string-level): the draft writes k tokens of its own vocabulary from its full q; their text
  is tokenized by the target's tokenizer, in the context of the sequence's last tokens, and the resulting
  target tokens are deterministic candidates (q' one-hot): x is accepted with probability p(x), and on a
  rejection the next token is drawn from p without x. Exact for any candidates fixed before p is seen.

Token boundaries, and how they are handled:
- "▁" (SentencePiece) and "Ġ" (byte-level BPE) both stand for a space: tokens are matched by the text they
  stand for (specdec.draft.vocab.token_texts), and texts are decoded and encoded by each side's own tokenizer.
- Accepted tokens are never re-tokenized. A string-level candidate list is the target tokenization of
  (tail text + draft text) after that of the tail text alone; when the draft's text would change the
  tail's own tokens (its first characters merge with the last accepted token), the candidates are the
  draft text tokenized on its own instead.
- The draft catches up on the target's text (DraftView): every round the target's sequence is decoded to
  text and encoded with the draft's tokenizer; the draft's cache is cut back to the longest prefix it shares
  with that encoding and fed the rest. A draft token the target rejected, or a re-tokenization of the
  accepted text that differs from what the draft wrote, is undone the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..runtime.cached import CachedLM, logits_width
from ..sampling import Sampling, draw, probabilities, sample
from .base import RowDrafter
from .proposal import Draft
from .tree import one_hot
from .vocab import SharedTokens, shared_tokens


def check_cross_vocabulary(reads_target_cache: bool) -> None:
    if reads_target_cache:
        raise ValueError(
            "a draft with another vocabulary cannot read the target's KV cache (its tokens, positions and layers "
            "differ): set reads_target_cache=False (model.reads_target_cache=false)"
        )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class DraftView:
    """The draft model's view of the target's sequence: the same text, in the draft's tokens, in its cache."""

    def __init__(self, model: PreTrainedModel, draft_tokenizer: PreTrainedTokenizerBase,
                 target_tokenizer: PreTrainedTokenizerBase):  # fmt: skip
        self.lm = CachedLM(model)
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.cached: list[int] = []  # the draft tokens whose states the cache holds, in order
        self.vocab = logits_width(model)

    def start(self) -> None:
        self.lm.reset()
        self.cached = []

    def text_of(self, tokens: list[int]) -> str:
        return self.target_tokenizer.decode(tokens, skip_special_tokens=True)

    def draft_ids(self, text: str) -> list[int]:
        """The draft tokenization of text (with the draft's own start token, if it adds one)."""
        ids = list(self.draft_tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids:  # an empty text (a prompt of special tokens only): start from a start-of-text token
            start = self.draft_tokenizer.bos_token_id
            ids = [start if start is not None else self.draft_tokenizer.eos_token_id or 0]
        return ids

    def catch_up(self, sequence: torch.Tensor) -> torch.Tensor:
        """Make the cache hold the draft tokenization of the target's sequence (1, L); the next-token logits (V_d,)."""
        ids = self.draft_ids(self.text_of(sequence[0].tolist()))
        keep = min(common_prefix(self.cached, ids), len(ids) - 1)  # the last token is always fed again
        self.lm.crop(keep)
        self.cached = ids
        return self.lm.forward(torch.tensor([ids[keep:]], device=self.lm.device))[0, -1, : self.vocab]

    def feed(self, token: int) -> torch.Tensor:
        """Append one draft token; its next-token logits (V_d,)."""
        self.cached = [*self.cached, token]
        return self.lm.forward(torch.tensor([[token]], device=self.lm.device))[0, -1, : self.vocab]

    def steps(self, sequence: torch.Tensor, k: int, pick: Callable[[torch.Tensor], tuple | None]) -> list:
        """Up to k draft steps after the target's sequence (1, L): pick(logits) gives what a step emits and the
        draft token to feed next, or None to stop; what the steps emitted."""
        logits, emitted = self.catch_up(sequence), []
        for i in range(k):
            picked = pick(logits)
            if picked is None:
                break
            emitted.append(picked[0])
            if i + 1 < k:
                logits = self.feed(picked[1])
        return emitted


class TokenIntersectionDrafter(RowDrafter):
    """TLI: drafts target tokens from the draft's q restricted to the shared tokens, renormalised."""

    draft_cost = "per_token"
    vocab_size = None  # its rows are as wide as the target's vocabulary

    def __init__(self, model: PreTrainedModel, draft_tokenizer: PreTrainedTokenizerBase,
                 target_tokenizer: PreTrainedTokenizerBase, reads_target_cache: bool = False,
                 renormalise: bool = True):  # fmt: skip
        check_cross_vocabulary(reads_target_cache)
        self.model, self.draft_tokenizer = model, draft_tokenizer  # what the naive method writes with
        self.view = DraftView(model, draft_tokenizer, target_tokenizer)
        self.shared: SharedTokens = shared_tokens(draft_tokenizer, target_tokenizer)
        self.renormalise = renormalise  # False only to show that the tests catch it

    def start_row(self, prompt: torch.Tensor) -> None:
        self.view.start()  # rollback: nothing, the next proposal catches up from the target's sequence

    def restricted(self, q: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """q' (V,) over target tokens: q's mass on each shared token (summed where several draft tokens share a
        text), renormalised; all zeros when q has no mass on a shared token."""
        keep = self.shared.target_ids < vocab_size
        q_t = torch.zeros(vocab_size, dtype=q.dtype, device=q.device)
        q_t.index_add_(0, self.shared.target_ids[keep].to(q.device), q[self.shared.draft_ids[keep].to(q.device)])
        total = q_t.sum()
        return q_t / total.clamp_min(torch.finfo(q.dtype).tiny) if self.renormalise else q_t

    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        def pick(logits: torch.Tensor) -> tuple | None:
            q_t = self.restricted(probabilities(logits, sampling), vocab_size)  # (V,)
            if float(q_t.sum()) <= 0:
                return None  # nothing shared to draft from
            x = sample(q_t[None], generator)  # (1,)
            return (x, q_t), self.shared.draft_of_target[int(x)]

        drafted = self.view.steps(sequence, k, pick) if k else []
        if not drafted:
            return Draft.empty(vocab_size, sequence.device)
        return Draft(torch.cat([x for x, _ in drafted]), torch.stack([q for _, q in drafted]), forwards=len(drafted))


class StringDrafter(RowDrafter):
    """String-level: the draft's own k tokens, as text, re-tokenized into deterministic target candidates."""

    draft_cost = "per_token"
    vocab_size = None

    def __init__(self, model: PreTrainedModel, draft_tokenizer: PreTrainedTokenizerBase,
                 target_tokenizer: PreTrainedTokenizerBase, reads_target_cache: bool = False, context_tokens: int = 8):  # fmt: skip
        check_cross_vocabulary(reads_target_cache)
        shared_tokens(draft_tokenizer, target_tokenizer)  # refuses a pair with nothing in common
        self.model, self.draft_tokenizer = model, draft_tokenizer
        self.view = DraftView(model, draft_tokenizer, target_tokenizer)
        if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 1:
            raise ValueError(f"context_tokens (accepted tokens whose text the draft's text is tokenized after) must "
                             f"be an int >= 1, got {context_tokens!r}")
        self.context_tokens = context_tokens

    def start_row(self, prompt: torch.Tensor) -> None:
        self.view.start()

    def candidates(self, sequence: torch.Tensor, drafted: list[int]) -> list[int]:
        """Target tokens for the draft's text after the sequence's last accepted tokens, never changing them."""
        encode = self.view.target_tokenizer
        text = self.view.draft_tokenizer.decode(drafted, skip_special_tokens=True)
        tail = self.view.text_of(sequence[0, -self.context_tokens :].tolist())
        before = encode(tail, add_special_tokens=False)["input_ids"]
        after = encode(tail + text, add_special_tokens=False)["input_ids"]
        if after[: len(before)] == before:
            return list(after[len(before) :])
        return list(encode(text, add_special_tokens=False)["input_ids"])  # the text would merge into the tail

    def propose_row(
        self, sequence: torch.Tensor, k: int, sampling: Sampling, vocab_size: int, generator: torch.Generator | None
    ) -> Draft:
        if k == 0:
            return Draft.empty(vocab_size, sequence.device)

        def pick(logits: torch.Tensor) -> tuple[int, int]:
            d = int(draw(logits[None], sampling, generator))
            return d, d

        drafted = self.view.steps(sequence, k, pick)
        tokens = torch.tensor([t for t in self.candidates(sequence, drafted) if t < vocab_size][:k], dtype=torch.long,
                              device=sequence.device)  # fmt: skip
        return Draft(tokens, one_hot(tokens, vocab_size), forwards=k)  # deterministic candidates: one-hot rows
