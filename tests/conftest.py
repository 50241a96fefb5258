"""Shared fixtures: tiny random models (no download) and the offline SmolLM2 pair (slow).

Conventions for the suite (`make test` runs it on 2 workers with pytest-xdist, `--dist loadgroup`):
- Default selection: everything not marked `exhaustive`. `make test-all` adds the exhaustive checks.
  Mark `slow` what loads the offline SmolLM2 model or runs a notebook; mark `exhaustive` only a check
  too long for `make test` that something faster in the default selection already covers in part.
- Expensive shared objects are fixtures, never module globals, so each worker builds them at most once:
  session scope for models (`smollm2`, `small_vocab_pair`), module scope for one run shared by checks.
  Name an expensive fixture in HEAVY_FIXTURES below: every test using it then runs on one worker
  (an `xdist_group`), and the longest tests start first (longest_first) so that the two workers finish together.
  Or mark a test `@pytest.mark.xdist_group("name")` yourself.
- Chi-square exactness tests: use tests/goodness_of_fit.py (`N_SAMPLES`, `chi_square_pvalue`, `PASS`,
  `REJECT`, `power`); show the test's power at your size against a wrong rule, as test_exactness.py does.
- Tiny-model tests run on one thread (fixture below); do not start threads or processes of your own.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import pytest
import torch

from specdec.runtime.tiny import ARCHITECTURES, tiny_model

GREEDY_TOKENS = 30  # new tokens of the greedy equality checks (arch_case)
HEAVY_FIXTURES = {"smollm2", "gemma3", "run_dir", "bench_result", "trained_tiny"}  # tests sharing one of these run on the same xdist worker


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist the workers share the cores: give each its share of torch threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of each heavy fixture on one worker; put the longest tests first (longest_first)."""
    for item in items:
        for name in sorted(HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))):
            defs = item._fixtureinfo.name2fixturedefs[name]
            scope = defs[-1].scope
            where = "" if scope == "session" else f"{item.module.__name__}::"
            item.add_marker(pytest.mark.xdist_group(f"{where}{name}"))
    items.sort(key=longest_first)  # stable: order kept otherwise


def longest_first(item: pytest.Item) -> tuple[bool, bool]:
    """Slow tests first, then the chi-square tests (each samples hundreds of generations on small_vocab_pair), so
    that the short ones fill the end and the two workers finish together."""
    return item.get_closest_marker("slow") is None, "small_vocab_pair" not in getattr(item, "fixturenames", ())


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup` xdist appends "@<group>" to a grouped test's node id. Without it the test runs
    on any worker, and every worker builds the heavy fixtures: fail, rather than silently doubling the work."""
    grouped = getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group")
    if grouped and "@" not in item.nodeid:
        pytest.fail("pytest-xdist did not group this test: pytest 9.2 breaks xdist_group "
                    "(pytest-dev/pytest-xdist#1386). Fix: pip install 'pytest<9.2' (pyproject.toml pins it).")


@pytest.fixture(autouse=True, scope="session")
def kernels_as_this_cpu_runs_them():
    """Whether the attention kernel runs here is asked once and kept (window_kernel is cached): ask it before any
    test fakes a CPU without AVX-512 (test_packed, test_app_setup), or the faked answer would stay with the worker,
    and the kernel's tests that follow on it would find no kernel (they did on a 2-core EPYC)."""
    from specdec.runtime.attention import window_kernel

    window_kernel()


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
    """Target and draft over a 5-token vocabulary, far apart (TV 0.49 over 3 tokens at T = 1): rejections are
    common, so a wrong residual shows at small N_SAMPLES (see tests/goodness_of_fit.py)."""
    target = tiny_model("llama", seed=0, scale=6.0, vocab_size=5, n_layers=1)
    draft = tiny_model("llama", seed=2, scale=6.0, vocab_size=5, n_layers=1)
    return target, draft


@pytest.fixture(scope="session")
def smollm2():
    """The offline target, its tokenizer, and its first 10 of 30 layers as draft (fp32, a third of a target step).

    Not the nf4 copy: without AVX512-BF16 a bitsandbytes 4-bit layer dequantizes its whole weight at every
    call, so that draft costs more than the target. test_models.py checks the quantized copies themselves.
    """
    from specdec.runtime.models import layer_truncated_copy, load_model, load_tokenizer

    name = "offline:smollm2-135m-instruct"
    target = load_model(name)
    return target, load_tokenizer(name), layer_truncated_copy(target, 10)


@pytest.fixture(scope="session")
def gemma3():
    """The offline Gemma 3 270M (specdec.runtime.offline.GEMMA3), its tokenizer and its torch dynamic int8 copy; loaded
    once per session, by `exhaustive` tests only (the first use downloads 240 MB and converts for ~45 s)."""
    from specdec.runtime.models import load_model, load_tokenizer

    name = "offline:gemma-3-270m"
    return load_model(name), load_tokenizer(name), load_model(name, quantization="dynamic_int8")


@pytest.fixture(scope="session")
def make_cfg():
    """compose(*overrides, hydra=False): conf/config.yaml composed with command-line overrides, nothing run.

    Each distinct command line is composed once per worker (about 0.2 s each); a test gets its own copy to change."""
    conf = str(Path(__file__).resolve().parents[1] / "conf")

    @functools.cache
    def composed(overrides: tuple[str, ...], hydra: bool):
        from hydra import compose, initialize_config_dir  # here: most tests need no Hydra

        with initialize_config_dir(conf, version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra)

    def compose_config(*overrides: str, hydra: bool = False):
        return copy.deepcopy(composed(overrides, hydra))

    return compose_config


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_case(request):
    """(architecture, tiny target, a draft that agrees in part, the target's greedy output after GREEDY_PROMPT)."""
    from fakes import GREEDY_PROMPT, hf_greedy

    from specdec.runtime.tiny import perturbed_copy

    target = tiny_model(request.param, seed=0, scale=20.0)
    return request.param, target, perturbed_copy(target, 0.15), hf_greedy(target, GREEDY_PROMPT, GREEDY_TOKENS)
