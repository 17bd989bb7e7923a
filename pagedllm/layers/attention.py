"""Attention over the paged KV cache: store this step's keys and values, then attend."""

import torch

from pagedllm.forward_context import get_attn_metadata
from pagedllm.layers.attention_backends.selector import get_attn_backend
from pagedllm.layers.inference_module import InferenceModule


class Attention(InferenceModule):
    """Causal attention of this rank's heads over the paged KV cache.

    `kv_cache` is (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_size];
    the model runner assigns it after construction. Query head h reads kv head
    h // (num_heads // num_kv_heads). The backend is chosen once, for the device and dtype the
    layer is built in (the model loader's defaults), and does all the work.

    vLLM's options: `per_layer_sliding_window` (a query sees only its last that many
    positions, itself included; None: all) and `logits_soft_cap` (scores s become
    cap * tanh(s / cap) before the softmax; None: as they are).
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        per_layer_sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads {num_kv_heads} must be >= 1 and divide num_heads {num_heads}"
            )
        if per_layer_sliding_window is not None and per_layer_sliding_window < 1:
            raise ValueError(f"sliding window {per_layer_sliding_window} must be >= 1 or None")
        if logits_soft_cap is not None and not logits_soft_cap > 0:
            raise ValueError(f"logits_soft_cap {logits_soft_cap} must be > 0 or None")
        self.sliding_window = per_layer_sliding_window or 0
        self.logits_soft_cap = logits_soft_cap or 0.0
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self.backend = get_attn_backend(torch.get_default_device(), torch.get_default_dtype())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H * D], k and v [T, KV * D] -> [T, H * D]."""
        if self.kv_cache is None:
            raise RuntimeError(
                "Attention.kv_cache is None: the model runner must assign "
                "(k_cache, v_cache) before the first forward"
            )
        attn_metadata = get_attn_metadata()
        k_cache, v_cache = self.kv_cache
        q = q.reshape(-1, self.num_heads, self.head_size)
        k = k.reshape(-1, self.num_kv_heads, self.head_size)
        v = v.reshape(-1, self.num_kv_heads, self.head_size)
        self.backend.write_kv(k, v, k_cache, v_cache, attn_metadata.slot_mapping)
        output = self.backend.forward(
            q,
            k_cache,
            v_cache,
            attn_metadata,
            self.scale,
            self.sliding_window,
            self.logits_soft_cap,
        )
        return output.view(-1, self.num_heads * self.head_size)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_size={self.head_size}, scale={self.scale}, backend={self.backend.name}"
            + (f", sliding_window={self.sliding_window}" if self.sliding_window else "")
            + (f", logits_soft_cap={self.logits_soft_cap}" if self.logits_soft_cap else "")
        )
