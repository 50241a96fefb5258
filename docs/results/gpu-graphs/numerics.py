"""Do CUDA graphs change a compiled pass's numbers? The same one-token passes on three caches of one compiled model:
twice without CUDA graphs (how reproducible the runtime is at all) and once replayed as CUDA graphs.

    python docs/results/gpu-graphs/numerics.py --layers 4 --out numerics.json

The model has the random-weight Llama-3 8B's shapes (every matrix the same size) with fewer layers, so it compiles
in seconds; bf16 on the GPU.
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.runtime.cached import CachedLM
from specdec.runtime.compiled import build_graphs, compile_model
from specdec.runtime.tiny import RANDOM_SHAPES, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b", help="a shape of specdec.runtime.tiny.RANDOM_SHAPES")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default="numerics.json")
    args = parser.parse_args()
    fields = dict(RANDOM_SHAPES[args.shape], n_layers=args.layers)
    model = tiny_model("llama", seed=fields.pop("seed"), dtype=getattr(torch, args.dtype), device=args.device,
                       **fields)
    runtime = compile_model(model, widths=(1, 8), capacity=512, autotune=False)
    build_graphs(model)
    graphs = runtime.graphs
    prompt = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0)).to(args.device)
    lms = {name: CachedLM(model) for name in ("off", "off_again", "on")}
    for lm in lms.values():
        lm.forward(prompt)
    token, worst = prompt[:, -1:], {"off_again": 0.0, "on": 0.0}
    argmax_differs = {"off_again": 0, "on": 0}
    for _ in range(args.steps):
        logits = {}
        for name, lm in lms.items():
            runtime.graphs = graphs if name == "on" else None
            logits[name] = lm.forward(token)[0, -1].float()
        for name, so_far in worst.items():
            worst[name] = max(so_far, (logits[name] - logits["off"]).abs().max().item())
            argmax_differs[name] += int(logits[name].argmax() != logits["off"].argmax())
        top2 = logits["off"].topk(2).values
        token = logits["off"].argmax().view(1, 1)
    result = {"args": vars(args), "torch": torch.__version__, "recorded": graphs.recorded if graphs else None,
              "replayed": graphs.replayed if graphs else None, "largest_logit_difference_from_off": worst,
              "steps_whose_argmax_differs": argmax_differs, "last_top2_margin": (top2[0] - top2[1]).item(),
              "logit_scale": logits["off"].abs().max().item()}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
