"""A token's own UTF-8 bytes, for chat logprobs' `bytes` field (OpenAI: "useful when
characters are represented by multiple tokens and their byte representations must be
combined"). Decoding a token alone gives U+FFFD for a piece of a character; its bytes come
from its vocabulary string instead, read by the tokenizer's decoder's rule:

- byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM): each character of the string stands for
  one byte, by GPT-2's table (printable bytes as themselves, the others as chr(256 + n));
- byte fallback (SentencePiece models: Llama 2, Mistral): `<0xHH>` is the byte HH, and
  `▁` a space.

Special tokens, tokenizers of another kind, and strings outside the table keep the bytes
of their decoded text."""

import json
import re
import weakref
from functools import cache

from transformers import PreTrainedTokenizerBase

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_BYTE_LEVEL, _FALLBACK, _TEXT = "byte_level", "byte_fallback", "text"
_STYLES: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, str]" = weakref.WeakKeyDictionary()


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable bytes ('!'..'~', '¡'..'¬',
    '®'..'ÿ') stand for themselves, every other byte b for chr(256 + n), n counting them
    in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars |= {b: 256 + n for n, b in enumerate(others)}
    return {chr(c): b for b, c in chars.items()}


def _style(tokenizer: PreTrainedTokenizerBase) -> str:
    """How the tokenizer's decoder turns vocabulary strings into bytes."""
    try:
        return _STYLES[tokenizer]
    except (KeyError, TypeError):
        pass
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    kinds: set[str] = set()
    if decoder is not None:
        state = json.loads(decoder.__getstate__())
        kinds = {d.get("type") for d in state.get("decoders", [state])}
    style = _BYTE_LEVEL if "ByteLevel" in kinds else _FALLBACK if "ByteFallback" in kinds else _TEXT
    try:
        _STYLES[tokenizer] = style
    except TypeError:  # not weakly referable: work it out each time
        pass
    return style


def token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int, text: str) -> bytes:
    """The bytes of token `token_id`, whose decoded text is `text`."""
    style = _style(tokenizer)
    if style == _TEXT or token_id in tokenizer.all_special_ids:
        return text.encode()
    token = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(token, str):
        return text.encode()
    if style == _BYTE_LEVEL:
        table = _byte_of_char()
        if all(char in table for char in token):
            return bytes(table[char] for char in token)
        return text.encode()
    match = _BYTE_FALLBACK.fullmatch(token)
    if match is not None:
        return bytes([int(match.group(1), 16)])
    return token.replace("\u2581", " ").encode()
