"""The benchmark's goals: every threshold a measured ratio is held to, in one place, and the goal entries of
bench.json (value, target, met, the contenders compared).

docs/performance.md quotes this table. Each ratio is ours over the other contender's tokens per second
(or measured over predicted), higher is better.
"""

from __future__ import annotations

import math

NOT_MEASURED = "not measured"
GOALS: dict[str, float | dict[str, float]] = {
    # best offline configuration of ours vs our target-only loop, geometric mean over prompt categories; by CPU:
    # higher where AVX-512 (with AVX512-BF16) runs the packed int8 copy and the compiled runtime's kernels
    "best_vs_target_only_geomean": {"avx512_bf16": 1.60, "other": 1.30},
    # the same configuration in its worst category: speculation must not lose where the text does not allow it
    "best_vs_target_only_min_category": 1.00,
    # the default configuration with a competing process during its first part (calibration included), over
    # target-only under the same schedule of load (bench.load)
    "default_under_load_vs_target_only": 0.97,
    # block over token-level verification, the same draft and k: tokens per target pass. At temperature 1 the
    # gain the paper proves; greedy, the two rules accept the same tokens, so exactly 1
    "block_vs_token_tokens_per_pass": {"sampled": 1.03, "greedy": 1.00},
    # traversal over the token-level tree rules, the same tree drafter with i.i.d. children: tokens per target
    # pass. Never fewer in expectation over the drafting (enumerated in tests/test_traversal.py), so 1.00 when
    # sampled; greedy, the two rules accept the same path, so exactly 1
    "traversal_vs_token_tokens_per_pass": {"sampled": 1.00, "greedy": 1.00},
    # our best n-gram configuration (chain, k="auto" or tree) vs Hugging Face prompt lookup at its defaults
    "vs_hf_prompt_lookup": 1.15,
    # our best configuration that runs the draft model (chain, k="auto", tree or hybrid tree) vs Hugging Face
    # assisted generation with the same draft, the lower of its default dynamic schedule (confidence
    # threshold on) and a fixed k
    "vs_hf_assisted": 1.20,
    # bench=cross: our best configuration with a draft of another tokenizer (string-level or token-level
    # intersection) vs Hugging Face's universal assisted generation with the same draft; the target is set for
    # temperature 1, the greedy run reports the same ratio against it
    "cross_vocab_vs_hf_uag": 1.15,
    # bench=cross: the same over target-only: where drafting across vocabularies does not pay, k=auto must fall
    # back to plain steps quickly enough not to lose
    "cross_vocab_vs_target_only": 0.97,
    # our target-only loop against Hugging Face's plain generate: the loop's own overhead
    "ar_vs_hf_plain": 0.95,
    # bench=batch: speculative (k="auto", the cost model choosing one k per batch, 0 included) over target-only
    # at the same batch size; the worst batch size must not lose, batch 4 must gain
    "batched_min_vs_target_only": 0.97,
    "batched_b4_vs_target_only": 1.15,
    # bench=short: the default run over target-only on outputs of at most 32 tokens (bench=short: 24), where
    # probing the drafts and warming up the online choice must not cost more than they win
    "short_outputs_vs_target_only": 0.95,
    # bench=heads: the best trained-head configuration over the best copy-draft configuration (tokens/s, same run)
    "head_vs_best_copy": 1.15,
    # bench=heads: the best head configuration's tokens per target pass with a fixed k, greedy
    "head_tokens_per_pass": 2.5,
    # bench=heads with model=gemma3 heads: the best head over target-only
    "gemma3_head_vs_target_only": 1.40,
    # bench=heads: the head chain's drafting seconds per draft token over one target step (c), at most this
    "head_c": 0.10,
    # bench=context: target-only tokens/s after a 2048-token context over after a 64-token one, on the default
    # runtime: decoding costs what attention over the context costs, no cliff (llama.cpp F32 on a 2-core EPYC: 0.68)
    "long_context_vs_short": 0.80,
    # bench=context with llama.cpp built: our target-only step after 2048 tokens of context over llama-bench's F32
    "ar_vs_llamacpp_f32_long": 1.00,
    # bench=llamacpp: the default over llama.cpp's F32 target-only and over its best speculative configuration (a
    # Q8_0 copy as draft, or prompt lookup) on the same weights and prompt tokens, geometric mean over categories
    "default_vs_llamacpp_f32": 1.60,
    "default_vs_llamacpp_speculative": 1.35,
    # bench=bf16 (conf/bench/bf16.yaml says each): greedy agreement, bf16 speed, what batch invariance costs
    "greedy_agreement_bf16": 1.00,
    "ar_bf16_vs_ar_f32": 1.60,
    "ar_bf16_vs_llamacpp_bf16": 0.90,
    "batch_invariance_cost": 0.95,
}
AT_MOST = {"head_c"}  # goals met at or below their threshold (a cost); every other goal is met at or above it
# Ratios bench.json still reports but no longer holds to a target (retired goals): ours over Hugging Face's
# at the same k and draft (speedup_vs_hf_assisted, speedup_vs_hf_prompt_lookup), measured over Thm 3.8
# (efficiency_vs_theory), the best drafter in summarization and retrieval (best_drafter_vs_ar_*).


ISSUE_9 = ("best_vs_target_only_geomean", "best_vs_target_only_min_category", "vs_hf_prompt_lookup",
           "vs_hf_assisted")  # the four ratios issue 9 asks for, in its order


def target_of(key: str, flags: list[str], greedy: bool) -> tuple[float, str | None]:
    """A goal's threshold on this machine and at this temperature, and which variant applied (None: one value)."""
    goal = GOALS[key]
    if not isinstance(goal, dict):
        return goal, None
    if "greedy" in goal:
        variant = "greedy" if greedy else "sampled"
    else:
        variant = "avx512_bf16" if "avx512_bf16" in flags else "other"
    return goal[variant], variant


def met(value: float | None, target: float, at_most: bool = False, exact: bool = False) -> bool | None:
    """Whether a measured value meets its target: at most or at least it, or within 1e-9 of it (exact); None when
    the value was not measured (None or NaN)."""
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return abs(value - target) < 1e-9 if exact else value <= target if at_most else value >= target


def goal_entries(ratios: dict[str, float], flags: list[str] = (), greedy: bool = True) -> dict[str, dict[str, object]]:
    """{key: {"value", "target", "met"}} for each goal whose ratio was measured (NaN: value and met None); flags:
    the machine's CPU flags, greedy: temperature 0 (goals whose threshold depends on them). An exact goal (the
    greedy block ratio, 1.00) is met within 1e-9."""
    entries: dict[str, dict[str, object]] = {}
    for key in [key for key in GOALS if key in ratios]:
        target, variant = target_of(key, list(flags), greedy)
        flag = met(ratios[key], target, key in AT_MOST, variant == "greedy")
        entries[key] = {"value": None if flag is None else ratios[key], "target": target, "met": flag}
        if variant is not None:
            entries[key]["target_for"] = variant
    return entries


# bench=runtime (experiments/bench/studies.py): the compiled runtime's pass costs and step, each at most its
# threshold (a pass of 2-5 tokens about one step; the step near the time to read the weights once), and its
# target-only loop against Hugging Face's eager generate, at least its threshold
RUNTIME_GOALS: dict[str, tuple[str, float]] = {
    "pass_cost_max_width_2_to_5": ("at_most", 1.10),
    "pass_cost_width_9": ("at_most", 1.40),
    "target_step_vs_memory_bound": ("at_most", 1.5),
    "ar_vs_hf_plain": ("at_least", 2.0),
}


def runtime_goal_entries(keys: dict[str, object]) -> dict[str, dict[str, object]]:
    """{key: {"value", "target", "direction", "met"}} for each runtime goal measured (None: not measured)."""
    entries = {}
    for key, (direction, target) in RUNTIME_GOALS.items():
        flag = met(keys.get(key), target, direction == "at_most")
        entries[key] = {"value": None if flag is None else keys[key], "target": target, "direction": direction, "met": flag}
    return entries


def mark_not_measured(goals: dict, failed: dict[str, dict], flags: list[str], greedy: bool, keys: tuple[str, ...]) -> None:
    """Goals whose ratio could not be measured because contenders failed: value None, met None, status "not
    measured" and the failed contenders (keys: the goals this bench measures, added when no ratio was left)."""
    if not failed:
        return
    for key in keys:
        goals.setdefault(key, {"value": None, "target": target_of(key, flags, greedy)[0], "met": None})
    for goal in goals.values():
        if goal["value"] is None:
            goal.update(status=NOT_MEASURED, failed_contenders=sorted(failed))


def annotate_goals(goals: dict, best: dict, k: int, contenders: dict) -> None:
    """Name, next to each goal ratio, the contenders it compares."""
    for key in ("best_vs_target_only_geomean", "best_vs_target_only_min_category"):
        if key in goals:
            goals[key].update(contender=best.get("offline"), against="ar")
    if "vs_hf_prompt_lookup" in goals:
        goals["vs_hf_prompt_lookup"].update(
            contender=best.get("ngram"),
            against="hf_lookup_default",
            against_k=contenders.get("hf_lookup_default", {}).get("prompt_lookup"),
            hf_best_fixed_k=best.get("hf_lookup_best_k"),
            hf_best_fixed_k_contender=best.get("hf_lookup_fixed_k"),
        )
    if "vs_hf_assisted" in goals:
        goals["vs_hf_assisted"].update(
            contender=best.get("model"), against=["hf_assisted_default", "hf_assisted"], against_fixed_k=k
        )
