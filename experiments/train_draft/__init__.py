"""`python -m experiments.train_draft`: train a draft head (specdec.draft.head) for a model pair's target."""
