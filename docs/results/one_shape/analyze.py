"""ab.jsonl (or ab_batch4.jsonl) -> the before/after tables: greedy outputs identical, tokens/s after over before
(median over the processes), at batch 1 (per method, all prompts) and at batch 4 (one batch of the same prompts).

    python docs/results/one_shape/analyze.py docs/results/one_shape/ab.jsonl
    python docs/results/one_shape/analyze.py docs/results/one_shape/ab_batch4.jsonl
"""

import json
import statistics
import sys


def rate(entry: dict) -> float:
    """Tokens per second of one call (a batch: all its rows' tokens)."""
    tokens = entry.get("emitted", len(entry["tokens"]))
    return tokens / entry["seconds"]


def table(runs: list[dict], key: str) -> list[str]:
    before = [r for r in runs if r["tree"] == "before"]
    after = [r for r in runs if r["tree"] == "after"]
    lines = ["| method | tok/s before | tok/s after | after / before | outputs identical |", "|---|---|---|---|---|"]
    for method in before[0][key]:
        def tps(run):
            entry = run[key][method]
            if key == "batch4":
                return rate(entry)
            tokens = sum(len(e["tokens"]) for e in entry.values())
            return tokens / sum(e["seconds"] for e in entry.values())
        b, a = statistics.median(map(tps, before)), statistics.median(map(tps, after))
        same = all(r[key][method] == before[0][key][method] or tokens_of(r[key][method]) == tokens_of(before[0][key][method])
                   for r in before + after)
        lines.append(f"| {method} | {b:.1f} | {a:.1f} | {a / b:.3f} | {same} |")
    return lines


def tokens_of(entry: dict):
    return entry["tokens"] if "tokens" in entry else {p: e["tokens"] for p, e in entry.items()}


runs = [json.loads(line) for line in open(sys.argv[1])]
if any(runs[0]["batch1"].values()):
    print("Batch 1 (each prompt alone, tokens/s over all prompts):\n")
    print("\n".join(table(runs, "batch1")) + "\n")
print("Batch 4 (the same prompts as one batch, tokens/s over all rows):\n")
print("\n".join(table(runs, "batch4")))
print("\nLoad average at the end of each process:", [(r["tree"], r["rep"], r["load"][0]) for r in runs])
