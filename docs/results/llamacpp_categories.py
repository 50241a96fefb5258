"""The bench=llamacpp keys over the categories of two bench.json files together (the 7 bundled and `long`), as the
docs quote them: per category the median tokens/s of each contender, then geometric means of the default over
llama.cpp's F32 target-only, over its best speculative configuration (the highest geometric mean of tokens/s over
all categories) and of our target-only over llama.cpp's F32.

    python docs/results/llamacpp_categories.py docs/results/llamacpp-bundled-epyc-ccab24e.json docs/results/llamacpp-long-epyc-ccab24e.json
"""

import json
import math
import sys

SPECULATIVE = ("llamacpp_spec_k4", "llamacpp_spec_k8", "llamacpp_lookup")


def medians(path: str) -> dict[str, dict[str, float]]:
    """Each contender's median tokens/s per category."""
    with open(path) as file:
        contenders = json.load(file)["contenders"]
    return {name: {c: v["median"] for c, v in x["by_category"].items()} for name, x in contenders.items()}


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


runs = [medians(path) for path in sys.argv[1:]]
names = set.intersection(*(set(run) for run in runs))
rate = {name: {c: v for run in runs for c, v in run[name].items()} for name in names}
categories = sorted(rate["default"])
best = max(SPECULATIVE, key=lambda name: geomean([rate[name][c] for c in categories]))


def over(a: str, b: str) -> float:
    return round(geomean([rate[a][c] / rate[b][c] for c in categories]), 3)


print(json.dumps({"categories": categories, "default_vs_llamacpp_f32": over("default", "llamacpp_f32"),
                  "default_vs_llamacpp_speculative": over("default", best), "best_speculative": best,
                  "ar_vs_llamacpp_f32": over("ar", "llamacpp_f32")}))
