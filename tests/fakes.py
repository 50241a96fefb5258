"""Drafters and rounds that tests build by hand."""

from types import SimpleNamespace

import torch


class BareDrafter:
    """A custom drafter (chain or tree: the loops call it the same way) that does not say how its cost grows."""

    vocab_size = None

    def start(self, prompt):
        pass

    def propose(self, sequence, length, sampling, vocab_size, generator):
        raise AssertionError("never reached")

    def rollback(self, length):
        pass


def chain_round(k, drafted, overlaps, seconds):
    """What a rule observes of a chain round that chose k and drafted `drafted` tokens."""
    from specdec.choose.cost import Choice
    from specdec.draft.proposal import Draft, RowProposals

    draft = RowProposals([Draft(torch.zeros(drafted, dtype=torch.long), torch.zeros(drafted, 1))])
    return SimpleNamespace(choice=Choice(k), proposed=draft, verified=draft, path=[[]], overlaps=[overlaps],
                           seconds=seconds)


def tree_round(choice, proposed, kept, path, seconds):
    """What a rule observes of a tree round, from the parents of the proposed and the kept tree."""
    def one_row(parents):
        return SimpleNamespace(rows=[SimpleNamespace(parents=torch.tensor(parents, dtype=torch.long))])

    return SimpleNamespace(choice=choice, proposed=one_row(proposed), verified=one_row(kept), path=[list(path)],
                           overlaps=[torch.zeros(0)], seconds=seconds)
