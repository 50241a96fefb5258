"""The run side: `python -m experiments.run`, one experiment per Hydra job (settings, the pair, the methods,
records, the summary, figures and the logger)."""
