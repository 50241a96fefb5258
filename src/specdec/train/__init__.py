"""Training what drafts: the draft head's teacher data, losses and validation acceptance (specdec.train.head)."""
