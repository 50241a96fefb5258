"""`python -m experiments.run`: the Hydra app (experiments.run.jobs)."""

from .jobs import main

main()
