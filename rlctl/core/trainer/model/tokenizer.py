"""A chat tokenizer from a model folder's ``tokenizer.json`` + ``tokenizer_config.json``.

Built on the ``tokenizers`` library and the folder's Jinja chat template, so no
torch/transformers is needed. It exposes the methods Tunix's sampler expects
(``encode``, ``decode``, ``bos_id``, ``eos_id``, ``pad_id``).

Padding: Tunix treats *every* token equal to ``pad_id`` as padding, prompts
included. Models whose pad token is also their chat-turn separator (SmolLM2:
``<|im_end|>``) would lose those separators, so the pad id is always a token
that never appears in a chat: ``<|endoftext|>`` or another unused special token.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from rlctl.core.errors import ConfigError

_PAD_CANDIDATES = ("<|endoftext|>", "<pad>", "<|pad|>", "[PAD]", "<unk>")


def _token_str(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


def _json_object(path: Path) -> dict[str, Any]:
    """An optional JSON file of the model folder: {} when absent, a ConfigError
    naming it when damaged."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON", hint="copy or download the model again") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object", hint="copy or download the model again")
    return data


class ChatTokenizer:
    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise ConfigError(f"model folder {str(folder)!r} has no tokenizer.json")
        try:
            self._tok = Tokenizer.from_file(str(tj))
        except Exception as e:  # the Rust side raises a bare Exception
            raise ConfigError(
                f"{tj}: not a tokenizer file ({str(e)[:120]})",
                hint="copy or download the model again",
            ) from e
        cfg = _json_object(folder / "tokenizer_config.json")
        gen = _json_object(folder / "generation_config.json")
        self.chat_template: str | None = cfg.get("chat_template")
        eos_tok = _token_str(cfg.get("eos_token"))
        eos_ids = []
        if eos_tok is not None and self._tok.token_to_id(eos_tok) is not None:
            eos_ids.append(self._tok.token_to_id(eos_tok))
        gen_eos = gen.get("eos_token_id")
        for i in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if isinstance(i, int) and i not in eos_ids:
                eos_ids.append(i)
        if not eos_ids:
            raise ConfigError(f"model folder {str(folder)!r}: no eos token in tokenizer config")
        self.eos_ids: list[int] = eos_ids
        self._pad = self._choose_pad(_token_str(cfg.get("pad_token")))
        bos = _token_str(cfg.get("bos_token"))
        self.bos_token = bos

    def _choose_pad(self, configured: str | None) -> int:
        """A pad id that is neither an eos/separator nor a chat-template token."""
        for cand in (configured, *_PAD_CANDIDATES):
            if cand is None:
                continue
            i = self._tok.token_to_id(cand)
            if i is not None and i not in self.eos_ids and cand not in (self.chat_template or ""):
                return i
        raise ConfigError("could not find a pad token distinct from eos in the tokenizer")

    # --- the interface Tunix's TokenizerAdapter checks for ---------------------
    def encode(self, text: str, **_: Any) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (the longest vocabulary entry as
        written, which is at least as long as its text): a text of more than ``n *
        max_token_chars`` characters has more than ``n`` tokens, known without
        tokenizing it."""
        return max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)

    def lengths(self, texts: list[str]) -> list[int]:
        """Token counts of many texts at once (the Rust tokenizer batches them)."""
        return [len(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], **_: Any) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def bos_id(self) -> int | None:
        return None  # chat templates write their own start tokens

    def eos_id(self) -> int:
        return self.eos_ids[0]

    def pad_id(self) -> int:
        return self._pad

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        """Render messages with the model's template, ready for the assistant turn."""
        if not self.chat_template:
            # plain fallback for base models without a template
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + "assistant:"
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True, bos_token=self.bos_token or ""
        )
