"""The bench=llamacpp keys over the categories of two bench.json files together (the 7 bundled and `long`), as the
docs quote them: each contender's per-category medians of both files in one set of figures, then the bench's own
llamacpp_ratios (geometric means over the categories; llama.cpp's best speculative configuration is the one with the
highest geometric mean of tokens/s over all of them).

    python docs/results/llamacpp_categories.py docs/results/llamacpp-bundled-epyc-ccab24e.json docs/results/llamacpp-long-epyc-ccab24e.json
"""

import json
import sys

from experiments.bench.ratios import llamacpp_ratios
from specdec.comparison import ContenderFigures


def contenders(path: str) -> dict:
    with open(path) as file:
        return json.load(file)["contenders"]


runs = [contenders(path) for path in sys.argv[1:]]
merged = {name: {**figures, "by_category": {c: v for run in runs for c, v in run[name]["by_category"].items()}}
          for name, figures in runs[0].items() if all(name in run for run in runs)}  # fmt: skip
f = ContenderFigures(merged)
print(json.dumps({"categories": f.categories, **{k: round(v, 3) for k, v in llamacpp_ratios(f).items()}}))
