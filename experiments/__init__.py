"""Entry points that read a Hydra config and call the specdec library: run, report (and bench)."""

from .train_draft import store as _store  # noqa: F401  (registers the ${trained_head:...} config resolver)
