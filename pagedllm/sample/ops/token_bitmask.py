"""Structured outputs' token bitmask: keep only the tokens a row's grammar allows.

The layout is llguidance's: row i of the bitmask [C, W] int32 holds one bit per token,
token t at bit t % 32 of word t // 32, set when the token is allowed.
"""

import torch


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask [C, W] int32 -> allowed [C, vocab_size] bool. Tokens past the bitmask's 32 * W
    (the model's logits may be wider than the tokenizer's vocabulary) are not allowed."""
    bits = 1 << torch.arange(32, dtype=torch.int32, device=bitmask.device)  # bit 31: -2**31
    allowed = ((bitmask.unsqueeze(-1) & bits) != 0).flatten(1)  # [C, 32 * W]
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    padding = allowed.new_zeros(allowed.shape[0], vocab_size - allowed.shape[1])
    return torch.cat([allowed, padding], dim=1)


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [B, V] to -inf in place where row rows[i] [C] may not take the token
    under bitmask[i] [C, W]; the other rows are not touched."""
    allowed = unpack_token_bitmask(bitmask, logits.shape[1])
    masked = logits.index_select(0, rows).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, masked)
