"""The library sets itself up (the layer above decoding): runtime, threads, calibrated drafters, k=auto's rule and the
acceptance rule, measured and chosen for a target and its candidate drafters, with a report of why
(specdec.auto.setup.prepare). Nothing else in the library imports it."""

from .runtime import RuntimeOptions
from .setup import Prepared, prepare

__all__ = ["Prepared", "RuntimeOptions", "prepare"]
