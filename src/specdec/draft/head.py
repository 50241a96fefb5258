"""A trained draft head that reads the target's features (EAGLE, Li et al. 2024), with a frequency-ranked output
vocabulary (FR-Spec, Zhao et al. 2025, arXiv 2502.14856).

Notation: f_i is the target's feature at position i (its last hidden state after the final norm, so that the
target's logits are W f_i with W its output layer), x_i the token at position i, e(x) the target's input embedding.

The head predicts the next feature from the current one and the token that follows it:

    f^_{i+1} = body(fc([f_i ; e(x_{i+1})]))        body: `layers` decoder layers of the target's architecture
    q(x_{i+2}) = softmax(W_S f^_{i+1})              W_S: the rows of W for the N most frequent tokens S

and a chain continues on its own prediction: f^_{i+1} with the drafted x_{i+2} gives f^_{i+2}. The embedding
and W are the target's own, frozen and shared (W_S is a copy of N rows); fc and the body are trained
(specdec.train.head). Outside S the draft's logits are -inf, so q(x) = 0 there and the draft never proposes such
a token: speculative sampling stays exact, because the rejection rule only needs every drafted token to be a
sample of the q it reports (notebook 04 derives it).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, PreTrainedModel

from ..runtime.cached import logits_width
from ..sampling import Sampling, one_hot_argmax, probabilities


def body_config(target: PreTrainedModel, layers: int):
    """The target's text config cut to `layers` full-attention layers and no vocabulary of its own (the body
    takes embeddings)."""
    config = copy.deepcopy(target.config.get_text_config())
    config.num_hidden_layers = layers
    config.vocab_size, config.pad_token_id = 1, None
    if getattr(config, "layer_types", None) is not None:  # the window stays set: some models build its mask anyway
        config.layer_types = ["full_attention"] * layers
    elif hasattr(config, "sliding_window"):
        config.sliding_window = None
    if hasattr(config, "use_sliding_window"):
        config.use_sliding_window = False
    return config


class DraftHead(nn.Module):
    """fc and `layers` decoder layers of the target's architecture; the output layer is W_S (N frozen rows of the
    target's output layer, `vocab` holding their token ids; None: the whole vocabulary)."""

    def __init__(self, target: PreTrainedModel, layers: int = 1, vocab: torch.Tensor | None = None):
        super().__init__()
        config = target.config.get_text_config()
        d = config.hidden_size
        self.layers = layers
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.body = AutoModel.from_config(body_config(target, layers)).to(target.dtype)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.vocab_size = logits_width(target)
        self.attach(target, vocab)
        self.to(target.device)

    def attach(self, target: PreTrainedModel, vocab: torch.Tensor | None) -> None:
        """Share the target's embedding and take the rows `vocab` of its output layer (frozen, not saved)."""
        output = target.get_output_embeddings()
        weight = (output.dense_weight() if hasattr(output, "dense_weight") else output.weight).detach()  # (V, d): a
        # packed output layer's laid back out of its panels
        ids = torch.arange(weight.shape[0]) if vocab is None else vocab.to(torch.long)
        if ids.numel() == 0 or int(ids.max()) >= self.vocab_size or ids.unique().numel() != ids.numel():
            raise ValueError(f"the draft vocabulary must be distinct token ids below {self.vocab_size}")
        object.__setattr__(self, "embed", target.get_input_embeddings())  # the target's: not a submodule, not trained
        self.register_buffer("vocab", ids.to(weight.device), persistent=False)  # (N,) token ids of S
        self.out = frozen_linear(weight[ids.to(weight.device)].clone())  # W_S (N, d): a linear, so that a runtime
        # can swap it as it swaps the body's (specdec.runtime.packed)

    @property
    def out_weight(self) -> torch.Tensor:
        """W_S (N, d)."""
        return self.out.weight

    @property
    def device(self) -> torch.device:
        return self.out_weight.device

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """fc([f_i ; e(x_{i+1})]): features (B, n, d), the tokens after them (B, n) -> (B, n, d)."""
        with torch.no_grad():
            embedded = self.embed(tokens)
        dtype = self.fc.weight.dtype  # the head may run in another dtype than the target (load_head's dtype)
        return self.fc(torch.cat([features.to(dtype), embedded.to(dtype)], dim=-1))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache=None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """The predicted next features f^ (B, n, d) for positions (B, n), through the body's cache if given (mask: a
        4D attention mask over the cache's slots, as a slot cache needs; None: the body's causal mask)."""
        out = self.body(inputs_embeds=self.inputs(features, tokens), position_ids=positions, cache=cache,
                        use_cache=cache is not None, attention_mask=mask)
        return out.last_hidden_state

    def subset_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """W_S f^ (..., N), soft-capped as the target caps its logits."""
        logits = self.out(predicted.to(self.out_weight.dtype)).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def logits(self, predicted: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary (..., V): W_S f^ on S, -inf elsewhere."""
        full = predicted.new_full((*predicted.shape[:-1], vocab_size or self.vocab_size), float("-inf"),
                                  dtype=torch.float32)
        kept = self.kept(vocab_size)
        full[..., self.vocab[kept]] = self.subset_logits(predicted)[..., kept]
        return full

    def probabilities(self, predicted: torch.Tensor, sampling: Sampling, vocab_size: int | None = None
                      ) -> torch.Tensor:
        """q (..., V), float32: `probabilities(self.logits(predicted), sampling)` computed on S alone and scattered
        into zeros (the tokens outside S have logit -inf, so probability 0 under every processing), which spares
        a pass over the whole vocabulary per draft token."""
        return self.spread(self.subset_logits(predicted), sampling, vocab_size)

    def spread(self, subset_logits: torch.Tensor, sampling: Sampling, vocab_size: int | None = None) -> torch.Tensor:
        """q (..., V) from the logits on S (..., N) (see `probabilities`)."""
        ids, q = self.subset_distribution(subset_logits, sampling, vocab_size)
        return spread_over(ids, q, vocab_size or self.vocab_size)

    def subset_distribution(self, subset_logits: torch.Tensor, sampling: Sampling, vocab_size: int | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ids of S below the vocabulary's width (N',) and q on them (..., N'), float32: q is 0 elsewhere, so a
        draw from these N' entries is a draw from q over the whole vocabulary, without a pass over it."""
        kept = self.kept(vocab_size)
        logits = subset_logits[..., kept]
        return self.vocab[kept], one_hot_argmax(logits) if sampling.greedy else probabilities(logits, sampling)

    def kept(self, vocab_size: int | None = None) -> slice | torch.Tensor:
        """The entries of S below the vocabulary's width `vocab_size` (None: the target's): all of them (attach checks
        the ids against the target's width) unless a narrower width is asked for."""
        if (vocab_size or self.vocab_size) >= self.vocab_size:
            return slice(None)
        return self.vocab < vocab_size

    def draft_ids(self, vocab_size: int | None = None) -> torch.Tensor:
        """The token ids the head drafts from below `vocab_size` (N',), in the order of its logits on S."""
        return self.vocab[self.kept(vocab_size)]


def spread_over(ids: torch.Tensor, q: torch.Tensor, width: int) -> torch.Tensor:
    """q over the vocabulary (..., width): the entries q (..., N') at the ids (N',), zeros elsewhere."""
    full = q.new_zeros((*q.shape[:-1], width))
    full[..., ids] = q
    return full


def frozen_linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free nn.Linear computing x @ weight.T whose weight (out, in) is a buffer outside the state dict: frozen
    (no parameter to train) and not saved (it is rebuilt from the target)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    del linear.weight
    linear.register_buffer("weight", weight, persistent=False)
    return linear


def frequency_ranked(counts: torch.Tensor, n: int | None) -> torch.Tensor | None:
    """The ids of the n most frequent tokens (counts: (V,) occurrences in the training text), most frequent
    first; None (the whole vocabulary) when n is None or covers it."""
    if n is None or n >= counts.numel():
        return None
    return torch.argsort(counts, descending=True, stable=True)[:n]


HEAD_FILE = "head.pt"


def most_frequent(ranked: torch.Tensor | None, n: int | None) -> torch.Tensor | None:
    """The first n ids of a frequency-ranked draft vocabulary (most frequent first, as frequency_ranked orders it)."""
    if n is None:
        return ranked
    if ranked is None:
        raise ValueError("this head drafts over the whole vocabulary, which carries no frequency ranking to cut")
    if not 0 < n <= ranked.numel():
        raise ValueError(f"vocab={n}: a head's draft vocabulary can be cut to 1..{ranked.numel()} tokens")
    return ranked[:n]


def save_head(head: DraftHead, folder: Path) -> Path:
    """Write the trained weights, the depth and the draft vocabulary to folder/head.pt (atomically: a file being
    written never replaces a whole one)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = None if head.vocab.numel() == head.vocab_size else head.vocab.cpu()
    state = {"layers": head.layers, "vocab": vocab, "weights": {k: v.detach().cpu() for k, v in head.state_dict().items()}}
    save_atomically(state, folder / HEAD_FILE)
    return folder / HEAD_FILE


def save_atomically(value: object, path: Path) -> None:
    """torch.save to a side file, then renamed over path: an interruption never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    torch.save(value, partial)
    partial.replace(path)


def load_head(folder: str | Path, target: PreTrainedModel, dtype: str | torch.dtype | None = None,
              vocab: int | None = None) -> DraftHead:
    """The head saved in folder (save_head) on this target (whose embedding and output layer it shares), its
    weights and W_S in `dtype` (None: the target's; "bfloat16" halves the bytes a draft token reads), its draft
    vocabulary cut to the `vocab` most frequent tokens of S (None: all of S; W_S shrinks with it)."""
    path = Path(folder) / HEAD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no trained draft head at {path}: train one with `python -m experiments.train_draft`")
    state = torch.load(path, map_location=target.device, weights_only=True)
    head = DraftHead(target, layers=state["layers"], vocab=most_frequent(state["vocab"], vocab))
    head.load_state_dict(state["weights"])
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype or target.dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"a head's dtype must be a floating-point torch dtype (e.g. bfloat16), got {dtype!r}")
    return head.to(dtype).eval()  # a head trained on a float32 target drafts for its bf16 copy too
