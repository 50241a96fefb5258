"""Shared fixtures: tiny random models (no download) and the offline SmolLM2 pair (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec.tiny import tiny_model


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny models are dominated by thread start-up cost on a shared 2-core machine: use one thread."""
    if request.node.get_closest_marker("slow") is None:
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(previous)
    else:
        yield


@pytest.fixture(scope="session")
def small_vocab_pair():
    """Target and draft over a 5-token vocabulary, far enough apart that rejections are common."""
    target = tiny_model("llama", seed=0, scale=3.0, vocab_size=5, n_layers=1)
    draft = tiny_model("llama", seed=1, scale=3.0, vocab_size=5, n_layers=1)
    return target, draft


@pytest.fixture(scope="session")
def smollm2():
    """The offline target, its tokenizer, and its nf4 copy as draft (converted once into the cache)."""
    from specdec.models import load_model, load_tokenizer

    name = "offline:smollm2-135m-instruct"
    target = load_model(name)
    draft = load_model(name, quantization="nf4", compute_dtype="bfloat16")
    return target, load_tokenizer(name), draft


@pytest.fixture(scope="session")
def make_cfg():
    """compose(*overrides, hydra=False): conf/config.yaml composed with command-line overrides, nothing run."""
    conf = str(Path(__file__).resolve().parents[1] / "conf")

    def compose_config(*overrides: str, hydra: bool = False):
        from hydra import compose, initialize_config_dir  # here: most tests need no Hydra

        with initialize_config_dir(conf, version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra)

    return compose_config
