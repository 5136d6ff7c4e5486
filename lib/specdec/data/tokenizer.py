"""Tokenizers behind one small interface: encode(text) -> ids, decode(ids) -> text, eos_token_id."""
from __future__ import annotations


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus BOS=256, EOS=257, PAD=258 (the tiny test pair)."""

    vocab_size = 259
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """Wraps a transformers tokenizer; `chat=True` wraps prompts in the model's chat template."""

    def __init__(self, tok, chat: bool = True):
        self.tok = tok
        self.chat = chat and getattr(tok, "chat_template", None) is not None
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        if self.chat:
            msgs = [{"role": "user", "content": text}]
            out = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return list(out)
        return list(self.tok(text).input_ids)

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


class IdTokenizer:
    """Synthetic-weight models: no text, token ids only (prompts come from a trace's lengths). No EOS, so
    generation always runs to max_new_tokens."""

    eos_token_id = None
    pad_token_id = 0

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        from ..errors import SpecdecError
        raise SpecdecError("a synthetic-weight pair has no tokenizer: set generation.acceptance_trace, whose "
                           "prompt lengths become random token ids")

    def decode(self, ids) -> str:
        return " ".join(str(int(i)) for i in ids)
