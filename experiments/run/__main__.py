"""`python -m experiments.run`: the Hydra app (experiments.run)."""

from .app import main

main()
