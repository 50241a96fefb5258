"""Tiny random causal LMs of every architecture the model catalogue uses, built from configs.

For tests, notebooks and benchmarks that must not download anything. Sliding windows are made
shorter than a test generation so that cache rollback across the window is exercised.
"""

from __future__ import annotations

import copy

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PreTrainedModel,
    Qwen2Config,
)

CONFIGS = {  # architecture -> (config class, fields of its own; sliding windows get the `sliding_window` argument,
    # layer_types: None alternates sliding-window and full-attention layers, ending on a full one)
    "llama": (LlamaConfig, {}),
    "gemma": (GemmaConfig, {"head_dim": 8}),
    "gemma2": (Gemma2Config, {"head_dim": 8, "sliding_window": None}),
    "gemma3": (Gemma3TextConfig, {"head_dim": 8, "sliding_window": None, "layer_types": None}),  # as Gemma 3 270M
    "mistral": (MistralConfig, {"sliding_window": None}),
    "mixtral": (MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "gpt_neox": (GPTNeoXConfig, {}),
    "qwen2": (Qwen2Config, {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 1}),
}
ARCHITECTURES = tuple(CONFIGS)


def tiny_config(arch: str, vocab_size: int = 32, n_layers: int = 2, sliding_window: int = 6, **overrides):
    """A config with hidden size 32 and 4 heads (2 key-value heads); sliding-window architectures get a
    short window.

    overrides replace any config field, the defaults above included (e.g. hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size: a public architecture's shapes, for random-weight benchmarks).
    """
    if arch not in CONFIGS:
        raise ValueError(f"unknown architecture {arch!r}; choices: {', '.join(CONFIGS)}")
    config_class, own = CONFIGS[arch]
    fields = {
        "vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": n_layers, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": None,
        "pad_token_id": None, "tie_word_embeddings": False,
    }  # fmt: skip
    if arch != "gpt_neox":  # GPT-NeoX has no grouped-query attention
        fields["num_key_value_heads"] = 2
    fields |= {key: sliding_window if value is None else value for key, value in own.items()}
    if "layer_types" in own:
        fields["layer_types"] = ["full_attention" if (n_layers - i) % 2 == 1 else "sliding_attention" for i in range(n_layers)]
    return config_class(**(fields | overrides))


def tiny_model(
    arch: str = "llama",
    seed: int = 0,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    **config,
) -> PreTrainedModel:
    """Random-weight model built on `device` in `dtype`; `scale` multiplies the output layer so that
    distributions are far from uniform."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(tiny_config(arch, **config), dtype=dtype)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model.eval()


def perturbed_copy(model: PreTrainedModel, noise: float, seed: int = 1) -> PreTrainedModel:
    """A copy with Gaussian noise of `noise` times each weight tensor's std: a draft that agrees partly."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in draft.parameters():
            if w.numel() > 1:
                w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
    return draft.eval()


# Public architecture shapes with random weights, for benchmarks (timing does not depend on the weights'
# values) and their CPU stand-ins; specdec.runtime.models.load_model("random:<shape>") builds one.
RANDOM_SHAPES: dict[str, dict[str, object]] = {
    "llama3-8b": {"hidden_size": 4096, "intermediate_size": 14336, "n_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
                  "tie_word_embeddings": False, "max_position_embeddings": 8192, "seed": 0},
    "llama3-1b": {"hidden_size": 2048, "intermediate_size": 8192, "n_layers": 16, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
                  "tie_word_embeddings": True, "max_position_embeddings": 8192, "seed": 1},
    "tiny-target": {"hidden_size": 64, "intermediate_size": 128, "n_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096, "seed": 0},
    "tiny-draft": {"hidden_size": 32, "intermediate_size": 64, "n_layers": 1, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
                   "max_position_embeddings": 4096, "seed": 1},
}  # fmt: skip


def random_model(shape: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> PreTrainedModel:
    """A Llama of one of RANDOM_SHAPES with random weights, built directly on the device."""
    if shape not in RANDOM_SHAPES:
        raise ValueError(f"unknown random shape {shape!r}; choices: {', '.join(RANDOM_SHAPES)}")
    fields = dict(RANDOM_SHAPES[shape])
    return tiny_model("llama", seed=fields.pop("seed"), dtype=dtype, device=device, **fields)


class ByteTokenizer:
    """The tokenizer of a random-weight model: a text's UTF-8 bytes are its token ids (every vocabulary of
    RANDOM_SHAPES has at least 256 tokens). No end-of-sequence token, no chat template: generations of random
    weights are meaningless text of real cost."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([list(text.encode("utf-8"))], dtype=torch.long)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {bytes([i]).hex(): i for i in range(256)}
