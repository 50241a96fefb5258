"""Entry points that read a Hydra config and call the specdec library: run, report (and bench)."""
