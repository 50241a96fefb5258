"""The benchmark machinery on tiny random Llama models: one repetition, keys of bench.json, the greedy check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from experiments import bench, gpu_bench


def tiny_llama(seed: int, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def result() -> dict:
    target, draft = tiny_llama(0), tiny_llama(1, layers=1)
    g = torch.Generator().manual_seed(0)
    prompts = [bench.Prompt(f"p{i}", cat, torch.randint(0, 96, (1, 12), generator=g))
               for i, cat in enumerate(["summarization", "retrieval", "code"])]
    return bench.run_bench(target, draft, prompts, k=3, max_new_tokens=10, repetitions=1)


def test_bench_json_has_every_contender_and_ratio(result, tmp_path):
    assert set(result["contenders"]) == set(bench.CONTENDERS)
    for key in bench.TARGETS:
        assert key in result["ratios"]
    assert result["costs"]["c"] > 0
    for figures in result["contenders"].values():
        assert figures["tokens_per_second"]["median"] > 0
        assert figures["tokens_per_second"]["n"] == 1
    bench.write(result, tmp_path, "bench", bench.markdown(result))
    loaded = json.loads((tmp_path / "bench.json").read_text())
    assert loaded["ratios"]["speedup_vs_hf_assisted"] == pytest.approx(result["ratios"]["speedup_vs_hf_assisted"])
    assert "speedup_vs_hf_assisted" in (tmp_path / "bench.md").read_text()


def test_greedy_outputs_of_all_six_contenders_are_identical(result):
    assert result["greedy_check"]["identical"], result["greedy_check"]["mismatches"]


def test_greedy_check_catches_a_different_output():
    outputs = {"ar": {"p": [1, 2, 3]}, "hf_plain": {"p": [1, 2, 3]}, "hf_assisted": {"p": [1, 5, 3]},
               "hf_lookup": {"p": [1, 2]}}
    check = bench.check_identical(outputs)
    assert not check["identical"]
    assert {(m["contender"], m["first_difference"]) for m in check["mismatches"]} == {("hf_assisted", 1), ("hf_lookup", 2)}


def test_scaling_rows_have_every_contender():
    target, draft = tiny_llama(0), tiny_llama(1, layers=1)
    prompt = torch.randint(0, 96, (1, 8))
    filler = torch.randint(0, 96, (1, 64))
    out = bench.run_scaling(target, draft, prompt, k=2, lengths=[4, 8], prompt_lengths=[16], filler=filler)
    assert [r["new_tokens"] for r in out["by_max_new_tokens"]] == [4, 8]
    assert out["by_prompt_length"][0]["prompt_tokens"] == 16
    assert all(r["spec_ngram_ms_per_token"] > 0 for r in out["by_max_new_tokens"])
    assert "by_prompt_length" in bench.scaling_markdown(out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit path")
def test_gpu_bench_exits_cleanly_without_cuda():
    done = subprocess.run([sys.executable, "-m", "experiments.gpu_bench"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0
    assert "no CUDA" in done.stdout
    assert gpu_bench.main is not None


def test_gpu_bench_dry_run_on_cpu(tmp_path):
    """The GPU script's whole path on toy shapes, so a GPU session does not spend device time on a bug."""
    assert gpu_bench.main(["--dry-run", "--context", "12", "--new-tokens", "6", "--repeats", "1",
                           "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert set(result["verify_ms_by_k"]) == {"1", "2", "4", "8", "16"}
    assert set(result["loops"]["tokens_per_second"]) == {
        "ar", "hf_plain", "spec_self", "hf_assisted_self", "spec_1b", "hf_assisted_1b"}
    assert result["loops"]["identical_to_ar"]["hf_plain"]
    assert (tmp_path / "gpu_bench.md").read_text().startswith(result["date"])
