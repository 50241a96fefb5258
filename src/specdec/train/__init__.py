"""Training what drafts: the draft head's teacher data, losses and validation acceptance (specdec.train.head),
the training conversations (specdec.train.conversations), token rows of conversations and cached teacher passes
(specdec.train.data), the training loop (specdec.train.loop)."""
