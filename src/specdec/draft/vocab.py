"""Two vocabularies side by side: what text each token stands for, and the tokens two tokenizers share.

A byte-level BPE (GPT-2, SmolLM2, Llama 3) writes each byte as a printable character ("Ġ" for a space, "Ċ"
for a newline); a SentencePiece-style vocabulary (Gemma, Llama 2) writes a space as "▁" and bytes it has no
token for as "<0xNN>". `token_texts` reads every token back to the text it stands for, so that "Ġworld" and
"▁world" are both " world"; tokens whose text is not a whole UTF-8 string (a lone byte of a multi-byte
character) and special tokens (<bos>, <|im_end|>) have none. Two tokens are shared when their texts are equal.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase


@functools.cache
def byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet read back: printable Latin-1 bytes stand for themselves, every other byte b
    is written as chr(256 + its rank among those bytes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


def is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = [getattr(backend, "decoder", None), getattr(backend, "pre_tokenizer", None)]
    return any(part is not None and "ByteLevel" in repr(part) for part in parts)


def token_text(token: str, byte_level: bool) -> str | None:
    """The text one vocabulary entry stands for, or None when it is not a whole string."""
    if byte_level:
        table = byte_decoder()
        if any(ch not in table for ch in token):
            return None
        data = bytes(table[ch] for ch in token)
    elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        data = bytes([int(token[3:5], 16)])  # SentencePiece byte fallback
    else:
        return token.replace("▁", " ")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def token_texts(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """Every ordinary token's id -> the text it stands for (special tokens and partial bytes left out)."""
    vocab = getattr(tokenizer, "get_vocab", None)
    if vocab is None:
        raise TypeError(f"{type(tokenizer).__name__} has no vocabulary (get_vocab): a cross-vocabulary draft needs "
                        "a tokenizer of the transformers kind, from a hub id or a local folder")
    added = getattr(tokenizer, "added_tokens_decoder", {})  # a property that builds its dict: read it once
    special = set(getattr(tokenizer, "all_special_ids", [])) | {i for i, token in added.items() if token.special}
    byte_level = is_byte_level(tokenizer)
    texts = {}
    for token, i in vocab().items():
        text = token_text(token, byte_level) if i not in special else None
        if text:
            texts[i] = text
    return texts


@dataclass
class SharedTokens:
    """The tokens of a draft vocabulary whose text is a token of the target's: draft ids -> target ids."""

    draft_ids: torch.Tensor  # (S,) long
    target_ids: torch.Tensor  # (S,) long, target_ids[s] has the text of draft_ids[s]
    draft_of_target: dict[int, int]  # a target id -> one draft id with its text

    @property
    def size(self) -> int:
        return self.draft_ids.numel()


def shared_tokens(draft: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase) -> SharedTokens:
    """Match the two vocabularies by text (token_texts); refuses a pair that shares no token."""
    by_text = {}
    for i, text in sorted(token_texts(target).items()):
        by_text.setdefault(text, i)
    pairs = sorted((d, by_text[text]) for d, text in token_texts(draft).items() if text in by_text)
    if not pairs:
        raise ValueError(f"the draft's tokenizer ({type(draft).__name__}) shares no token with the target's "
                         f"({type(target).__name__}): token-level intersection has nothing to draft from")
    draft_ids, target_ids = (torch.tensor(column, dtype=torch.long) for column in zip(*pairs))
    inverse = {}
    for d, t in pairs:
        inverse.setdefault(t, d)
    return SharedTokens(draft_ids, target_ids, inverse)
