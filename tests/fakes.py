"""What several tests share: drafters, rounds and clocks built by hand, and the target's own greedy output."""

import random
from types import SimpleNamespace

import torch

GREEDY_PROMPT = torch.tensor([[0, 5, 3, 7, 5, 3]])  # repeats itself: lookups and drafts agree in part


def hf_greedy(model, ids, n):
    """The model's own greedy generate (Hugging Face): n new tokens after ids (1, L)."""
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[-1] :]


class RandomClock:
    """Each reading advances time by a uniform amount in [0, 1): varied, reproducible round costs."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.rng.random()
        return self.now


class BareDrafter:
    """A custom drafter (chain or tree: the loops call it the same way) that does not say how its cost grows."""

    vocab_size = None

    def start(self, prompts):
        pass

    def propose(self, sequences, length, sampling, vocab_size, generator):
        raise AssertionError("never reached")

    def rollback(self, lengths):
        pass

    def select(self, rows):
        pass


def chain_round(k, drafted, overlaps, seconds, timed=True):
    """What a rule observes of a chain round that chose k and drafted `drafted` tokens (timed=False: a graph
    compiled during it)."""
    from specdec.choose.cost import Choice
    from specdec.draft.proposal import Draft, RowProposals

    draft = RowProposals([Draft(torch.zeros(drafted, dtype=torch.long), torch.zeros(drafted, 1))])
    return SimpleNamespace(choice=Choice(k), proposed=draft, verified=draft, path=[[]], overlaps=[overlaps],
                           seconds=seconds, timed=timed)


def tree_round(choice, proposed, kept, path, seconds, timed=True):
    """What a rule observes of a tree round, from the parents of the proposed and the kept tree."""
    def one_row(parents):
        return SimpleNamespace(rows=[SimpleNamespace(parents=torch.tensor(parents, dtype=torch.long))])

    return SimpleNamespace(choice=choice, proposed=one_row(proposed), verified=one_row(kept), path=[list(path)],
                           overlaps=[torch.zeros(0)], seconds=seconds, timed=timed)


def log_target_passes(monkeypatch, log: list) -> None:
    """Append ("verify",) to `log` at every target pass of the loop (RowProposals.score)."""
    from specdec.draft.proposal import RowProposals

    score = RowProposals.score

    def logged_score(self, *args, **kwargs):
        log.append(("verify",))
        return score(self, *args, **kwargs)

    monkeypatch.setattr(RowProposals, "score", logged_score)


def largest_logit_difference(model, ids: torch.Tensor) -> float:
    """Largest |compiled - eager| logit over a prefill and passes of widths 1, 3 (padded to 4) and 2."""
    from specdec.runtime.cached import CachedLM
    from specdec.runtime.compiled import compile_model, compiled_forward, eager_model

    compiled = CachedLM(model)
    runtime = compiled_forward(model)
    eager_model(model)
    eager = CachedLM(model)
    compile_model(model, widths=runtime.widths, capacity=runtime.capacity, autotune=False,
                  dynamic_width=runtime.dynamic_width)
    worst = 0.0
    for start, end in ((0, 8), (8, 9), (9, 12), (12, 14)):
        chunk = ids[:, start:end]
        worst = max(worst, float((compiled.forward(chunk) - eager.forward(chunk)).abs().max()))
    return worst


def one_token_steps(lms: list, prompts: list[torch.Tensor], steps: int) -> list[list[torch.Tensor]]:
    """Each CachedLM takes its prompt (1, L), then `steps` one-token passes (tokens 1, 2, ...), the lms taking turns;
    each lm's logits per pass. Two caches of one compiled model interleaved (tests/test_graphs.py, test_gpu.py)."""
    for lm, prompt in zip(lms, prompts):
        lm.forward(prompt.to(lm.device))
    logits = [[] for _ in lms]
    for step in range(steps):
        for i, lm in enumerate(lms):
            logits[i].append(lm.forward(torch.tensor([[step + 1]], device=lm.device)))
    return logits
