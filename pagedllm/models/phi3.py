"""Phi-3 (Phi-3 / 3.5 mini and medium, Phi-4, Phi-4-mini), as transformers'
Phi3ForCausalLM: Llama's decoder whose checkpoints store q, k and v as one `qkv_proj` and
gate and up as one `gate_up_proj`; a rotary embedding over `partial_rotary_factor` of each
head (config_fields.rotary_dim) with LongRoPE scaling (layers/rotary_embedding.py), and a
`sliding_window` on every layer where the config sets one.

The fused tensors are cut into their parts at load, so tensor parallelism shards each part
as Llama's (QKVParallelLinear, MergedColumnParallelLinear)."""

from collections.abc import Iterable, Iterator

import torch

from pagedllm.models.config_fields import head_dim
from pagedllm.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_fused(weights))

    def _split_fused(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        config = self.config
        size = head_dim(config)
        q = config.num_attention_heads * size
        kv = (getattr(config, "num_key_value_heads", None) or config.num_attention_heads) * size
        inter = config.intermediate_size
        for name, tensor in weights:
            if ".qkv_proj." in name:
                parts = {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}
            elif ".gate_up_proj." in name:
                parts = {"gate_proj": (0, inter), "up_proj": (inter, inter)}
            else:
                yield name, tensor
                continue
            fused = name.split(".")[-2]
            if tensor.shape[0] != sum(n for _, n in parts.values()):
                raise ValueError(
                    f"checkpoint tensor {name!r} has {tensor.shape[0]} rows; {fused} fuses "
                    f"{', '.join(f'{p} ({n})' for p, (_, n) in parts.items())}"
                )
            for part, (start, rows) in parts.items():
                yield name.replace(f".{fused}.", f".{part}."), tensor.narrow(0, start, rows)
