"""Drafters that tests build by hand."""


class BareDrafter:
    """A custom drafter (chain or tree: the loops call it the same way) that does not say how its cost grows."""

    vocab_size = None

    def start(self, prompt):
        pass

    def propose(self, sequence, length, sampling, vocab_size, generator):
        raise AssertionError("never reached")

    def rollback(self, length):
        pass
