"""How close weight-only copies of the offline SmolLM2-135M target stay to it: the acceptance a copy would get.

For each bundled prompt (data/prompts.jsonl) the float32 target writes its greedy answer (96 new tokens); then the
target and each copy score that text in one pass (teacher forcing, as speculative decoding sees it), and at every
new position we take
- greedy agreement: whether the copy's most likely token is the target's (greedy speculative decoding accepts a
  draft token exactly then);
- beta = sum_x min(p(x), q(x)) at temperature 1, Leviathan's alpha per position.
Copies (every linear, the tied output layer included; embeddings stay float32):
- bf16: the weights rounded to bfloat16, computed in float32;
- int8: symmetric int8 with one scale per output (the largest |w| over 127): what quantization=packed_int8 computes;
- int4_g32: symmetric 4-bit with one scale per 32 weights (for scale: where a 4-bit copy would land);
- int8_a8: int8 weights and each linear's input rounded per token to 8 bits (asymmetric: a scale and a zero point
  from the token's min and max), what an int8 x uint8 dot-product kernel (AVX512-VNNI vpdpbusd) would compute;
- int8_a16: int8 weights and each input rounded per token to 16-bit integers (symmetric, the largest |x| at A =
  (2^31 - 1) // (127 K), at most 32767: no int32 sum of K products overflows), what int16_inputs.cpp computes.

    python docs/results/kernel/weight_only.py >> docs/results/kernel/weight-only-agreement.jsonl
    python docs/results/kernel/weight_only.py int8 int8_a8 int8_a16 >> docs/results/kernel/weight-only-agreement.jsonl

Prints one JSON line (the means over all positions of all prompts).
"""

import copy
import json
import sys

import torch

from specdec.runtime.models import encode_prompt, load_model, load_tokenizer

NAME = "offline:smollm2-135m-instruct"


def rounded(weight: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "bf16":
        return weight.bfloat16().float()
    if kind == "int8":
        scale = weight.abs().amax(1, keepdim=True) / 127
        return (weight / scale).round().clamp(-127, 127) * scale
    groups = weight.view(weight.shape[0], -1, 32)
    scale = groups.abs().amax(2, keepdim=True) / 7
    return ((groups / scale).round().clamp(-7, 7) * scale).view_as(weight)


def rounded_input(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded per token (its last dimension) to `bits`-bit integers, as a kernel with integer inputs sees it."""
    if bits == 8:  # asymmetric, 0..255
        low, high = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        scale = ((high - low) / 255).clamp_min(1e-12)
        zero = (-low / scale).round()
        return ((x / scale).round() + zero).clamp(0, 255).sub(zero) * scale
    scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / min(32767, (2**31 - 1) // (127 * x.shape[-1]))
    return (x / scale).round() * scale


def weight_only_copy(model, kind):
    twin = copy.deepcopy(model)
    weights, _, inputs = kind.partition("_a")
    for module in twin.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight = torch.nn.Parameter(rounded(module.weight.detach(), weights))  # unties the head
            if inputs:
                module.register_forward_pre_hook(lambda _, args, bits=int(inputs): (rounded_input(args[0], bits),))
    return twin


torch.set_num_threads(2)
target, tokenizer = load_model(NAME), load_tokenizer(NAME)
copies = {kind: weight_only_copy(target, kind) for kind in sys.argv[1:] or ("bf16", "int8", "int4_g32")}
sums = {kind: [0, 0.0] for kind in copies}
positions = 0
with torch.inference_mode():
    for line in open("data/prompts.jsonl"):
        ids = encode_prompt(tokenizer, json.loads(line)["prompt"])
        text = target.generate(ids, max_new_tokens=96, do_sample=False)
        p = target(text).logits[0, ids.shape[1] - 1:-1].float()
        positions += p.shape[0]
        for kind, twin in copies.items():
            q = twin(text).logits[0, ids.shape[1] - 1:-1].float()
            sums[kind][0] += (q.argmax(-1) == p.argmax(-1)).sum().item()
            sums[kind][1] += (1 - 0.5 * (p.softmax(-1) - q.softmax(-1)).abs().sum(-1)).sum().item()
out = {"positions": positions, "argv": sys.argv[1:]}
for kind, (agree, beta) in sums.items():
    out[kind] = {"greedy_agreement": round(agree / positions, 4), "beta_t1": round(beta / positions, 4)}
print(json.dumps(out))
