"""Group-quantized integer weights (GPTQ, AWQ, compressed-tensors) as GGUF blocks.

Those formats store a linear weight as integer codes c with a scale s and a zero point z
per output row and group of input columns: w = s * (c - z). A group of 32 or a multiple of
32 columns covers whole GGUF blocks of 32, so each block takes its group's scale and zero:
- 4 bits, every zero 8 (symmetric): Q4_0 (w = d * (c - 8)), the codes as they are;
- 4 bits otherwise: Q4_1 (w = d * c + m with m = -z * s);
- 8 bits, every zero 128 (symmetric): Q8_0 (w = d * q, q = c - 128 as int8).
d and m are fp16 in a block. A GPTQ or AWQ scale is fp16 already, so Q4_0 and Q8_0 hold
the checkpoint's weights exactly; Q4_1's m = -z * s rounds to fp16 (within 2^-11 of |m|,
below 1/256 of a quantization step), as do bf16 or float32 scales outside fp16's grid.
"""

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType

Q = GGMLQuantizationType
BLOCK = 32


@dataclass
class GroupQuantized:
    """w[n, k] = scale[n, g] * (codes[n, k] - zero[n, g]) with g = k // group (the last
    group may be short)."""

    codes: torch.Tensor
    """uint8 [N, K], the unsigned codes (0 .. 2^bits - 1)."""
    scale: torch.Tensor
    """float [N, G]."""
    zero: torch.Tensor
    """int [N, G], in the codes' unsigned range (8 for symmetric 4 bits)."""
    bits: int
    group: int
    """Input columns per group (K for one scale per row)."""

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        groups = -(-k // self.group)
        for name in ("scale", "zero"):
            shape = tuple(getattr(self, name).shape)
            if shape != (n, groups):
                raise ValueError(
                    f"{name} of shape {shape} for {n} x {k} weights in groups of {self.group}"
                )

    def _per_column(self, values: torch.Tensor, step: int = 1) -> torch.Tensor:
        """values [N, G] at every `step`-th column: [N, K / step]."""
        columns = torch.arange(0, self.codes.shape[1], step)
        return values[:, columns // self.group]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        scale = self._per_column(self.scale.float())
        zero = self._per_column(self.zero.float())
        return ((self.codes.float() - zero) * scale).to(dtype)

    def block_type(self) -> Q:
        """The GGUF type that holds these weights (ValueError if none does)."""
        return block_type(self.bits, bool((self.zero == 1 << (self.bits - 1)).all()))

    def to_blocks(self, qtype: Q) -> torch.Tensor:
        """uint8 [N, K / 32 * type_size]: the rows as GGUF blocks of `qtype`."""
        n, k = self.codes.shape
        if self.group % BLOCK or k % BLOCK:
            raise ValueError(f"groups of {self.group} over {k} columns are not whole blocks")
        scale = self._per_column(self.scale.float(), BLOCK).unsqueeze(-1)
        zero = self._per_column(self.zero.float(), BLOCK).unsqueeze(-1)
        codes = self.codes.reshape(n, k // BLOCK, BLOCK)
        d = _f16_bytes(scale)
        if qtype == Q.Q8_0:
            q = (codes.to(torch.int16) - 128).to(torch.int8).view(torch.uint8)
            return torch.cat([d, q], dim=-1).reshape(n, -1)
        nibbles = codes[..., :16] | (codes[..., 16:] << 4)
        if qtype == Q.Q4_0:
            return torch.cat([d, nibbles], dim=-1).reshape(n, -1)
        m = _f16_bytes(-zero * scale)
        return torch.cat([d, m, nibbles], dim=-1).reshape(n, -1)


def block_type(bits: int, symmetric: bool) -> Q:
    """The GGUF type of group-quantized weights of `bits` (ValueError if none holds them)."""
    if bits == 4:
        return Q.Q4_0 if symmetric else Q.Q4_1
    if bits == 8 and symmetric:
        return Q.Q8_0
    raise ValueError(f"no GGUF block type holds {bits}-bit weights (symmetric: {symmetric})")


def native_block_type(bits: int, symmetric: bool, group: int, columns: int) -> Q | None:
    """The block type a weight of this layout runs in, None when it is dequantized."""
    if columns % BLOCK or group % BLOCK:
        return None
    try:
        return block_type(bits, symmetric)
    except ValueError:
        return None


def _f16_bytes(values: torch.Tensor) -> torch.Tensor:
    """float [..., 1] -> uint8 [..., 2]: each value as fp16, little-endian."""
    return values.to(torch.float16).contiguous().view(torch.uint8)
