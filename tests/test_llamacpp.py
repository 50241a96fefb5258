"""llama.cpp as a contender (specdec.llamacpp): what it is asked and what is refused, without building it (the suite
never depends on the build; `make llamacpp` and the bench run it)."""

import pytest
import torch

from specdec.llamacpp import LlamaCppOptions, engine, llamacpp_depths, request_of
from specdec.sampling import GREEDY, Sampling


def test_greedy_asks_for_temperature_zero_and_sampling_switches_off_llamacpps_own_filters():
    """The same prompt tokens, no prompt cache (every call prefills, as ours does); greedy is llama.cpp's argmax
    (temperature 0); a sampled run gets the plain distribution at its temperature, with the run's top-k / top-p and
    none of llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05)."""
    ids = torch.tensor([[1, 504, 3458]])
    greedy = request_of(ids, GREEDY, 16, 3, stop_at_eos=True)
    assert greedy["prompt"] == [1, 504, 3458] and greedy["n_predict"] == 16 and greedy["temperature"] == 0.0
    assert greedy["cache_prompt"] is False and greedy["ignore_eos"] is False and greedy["seed"] == 3
    sampled = request_of(ids, Sampling(temperature=0.7), 16, 3, stop_at_eos=False)
    assert sampled["temperature"] == 0.7 and sampled["ignore_eos"] is True
    assert (sampled["top_k"], sampled["top_p"], sampled["min_p"], sampled["repeat_penalty"]) == (0, 1.0, 0.0, 1.0)
    assert request_of(ids, Sampling(temperature=1.0, top_k=20, top_p=0.9), 8, 0, True)["top_k"] == 20


@pytest.mark.parametrize("options, message", [
    ({"weights": "q4_k"}, "llamacpp.weights must be one of f32, bf16, q8_0"),
    ({"draft": "f16"}, "llamacpp.draft must be one of f32, bf16, q8_0"),
    ({"draft": "q8_0", "lookup": 3}, "two kinds of speculation"),
    ({"threads": 0}, "llamacpp.threads must be an integer >= 1"),
])  # fmt: skip
def test_options_that_cannot_run_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        LlamaCppOptions(**options)


def test_a_missing_build_says_how_to_build_it_and_the_depth_study_records_why_it_was_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"not built in .*run `make llamacpp`"):
        engine()
    skipped = llamacpp_depths(tmp_path / "model", [64, 2048], threads=2)
    assert set(skipped) == {"skipped"} and "make llamacpp" in skipped["skipped"]
