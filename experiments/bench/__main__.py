"""`python -m experiments.bench`: the Hydra app (experiments.bench)."""

from .app import main

main()
