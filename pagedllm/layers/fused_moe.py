"""Mixture-of-experts feed-forward: top-k router plus SwiGLU experts, as in vLLM's FusedMoE.

Experts are held fused: w13 stacks each expert's gate and up rows, w2 its down matrix. For
tensor parallelism each expert's intermediate dimension is split across ranks, so rank r
holds gate/up rows and down columns [r*I/P, (r+1)*I/P) and the partial outputs are summed.

The compute groups the flat (token, expert) assignments by expert, so each active expert
runs one matmul over all of its tokens: 8 small ones for a decode token routed to 8 of 128
experts, a few large ones for a prefill batch. The expert weights belong to the layer's
quant method, which runs each expert's MLP (float, or quantized blocks kept per expert).
"""

import torch
from torch import nn

from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from pagedllm.layers.activation import SiluAndMul
from pagedllm.layers.inference_module import InferenceModule
from pagedllm.layers.linear import divide
from pagedllm.layers.parameter import block_of, columns, copy_weight, shard_of
from pagedllm.layers.quantization.base_config import (
    FusedMoEMethodBase,
    LayerKind,
    QuantizationConfig,
)
from pagedllm.layers.quantization.unquantized import UnquantizedFusedMoEMethod

_CHECKPOINT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class FusedMoE(InferenceModule):
    """Routed experts of one MoE block.

    w13_weight: [E, 2 * I_p, H], gate rows then up rows of this rank's shard.
    w2_weight:  [E, H, I_p].
    """

    quant_kind = LayerKind.FUSED_MOE
    # Its forward reads the per-expert token counts on the host (one sync a layer), which a
    # CUDA graph cannot record: a fused MoE kernel would take the counts on the device.
    syncs_host = True

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool = True,
        reduce_results: bool = True,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be in [1, num_experts={num_experts}]")
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.intermediate_size_per_partition = divide(
            intermediate_size, self.tp_size, "moe intermediate size"
        )
        self.renormalize = renormalize
        self.reduce_results = reduce_results
        self.act_fn = SiluAndMul()
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        self.quant_method: FusedMoEMethodBase = method or UnquantizedFusedMoEMethod()
        self.quant_method.create_weights(
            self,
            num_experts,
            hidden_size,
            self.intermediate_size_per_partition,
            torch.get_default_dtype(),
            weight_loader=self.weight_loader,
        )

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str, expert_id: int
    ) -> None:
        """Load one expert's full checkpoint matrix and keep this rank's slice of it.

        shard_id "w1" (gate_proj) and "w3" (up_proj) are [I, H] and go to w13_weight;
        "w2" (down_proj) is [H, I] and goes to w2_weight.
        """
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert_id {expert_id} must be in [0, {self.num_experts})")
        if shard_id not in _CHECKPOINT_NAMES:
            raise ValueError(f"shard_id {shard_id!r} must be one of 'w1', 'w3', 'w2'")
        full, shard = self.intermediate_size, self.intermediate_size_per_partition
        block = block_of(param)
        split_dim = 1 if shard_id == "w2" else 0
        expected = (self.hidden_size, full) if shard_id == "w2" else (full, self.hidden_size)
        what = f"expert {expert_id} {_CHECKPOINT_NAMES[shard_id]}"
        loaded_shape = (loaded_weight.shape[0], columns(loaded_weight, block))
        if loaded_weight.dim() != 2 or loaded_shape != expected:
            raise ValueError(
                f"{what} shape mismatch: checkpoint has {tuple(loaded_weight.shape)}, "
                f"the model expects {expected}"
            )
        source = shard_of(loaded_weight, split_dim, self.tp_rank, shard, self.tp_size, block)
        target = param.data[expert_id]
        if shard_id != "w2":
            target = target.narrow(0, 0 if shard_id == "w1" else shard, shard)
        copy_weight(target, source, what)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """[T, H] hidden states and [T, E] router logits -> [T, H] (summed over ranks)."""
        topk_weights, topk_ids = self.select_experts(router_logits, hidden_states.dtype)
        out = self.apply_experts(hidden_states, topk_weights, topk_ids)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def select_experts(
        self, router_logits: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax in float32, top-k, optional renormalisation: [T, K] weights and expert ids."""
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        topk_weights, topk_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        return topk_weights.to(dtype), topk_ids

    def apply_experts(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """Run each active expert once over its tokens; [T, H] -> [T, H] weighted sum.

        The T*K assignments are sorted by expert so each expert's rows are contiguous; the
        per-expert counts cross to the host in one sync. The results are put back in
        (token, k) order and summed with the routing weights by one bmm, in the same order
        for every token, rather than by index_add_: its duplicate-index path on CPU
        (torch 2.13, 2 threads) took 10-70 ms for a single decode token.
        """
        num_tokens = hidden_states.shape[0]
        flat_ids = topk_ids.flatten()
        order = torch.argsort(flat_ids, stable=True)  # sorted position -> flat (token, k)
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        x = hidden_states.index_select(0, order // self.top_k)  # [T*K, H], grouped by expert
        y = torch.empty_like(x)  # [T*K, H], every row written by its expert below
        start = 0
        for expert_id, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            y[start:end] = self.quant_method.apply_expert(self, x[start:end], expert_id)
            start = end
        y = y.index_select(0, torch.argsort(order))  # back to (token, k) order
        y = y.view(num_tokens, self.top_k, self.hidden_size)
        return torch.bmm(topk_weights.unsqueeze(1), y).squeeze(1)

    @staticmethod
    def make_expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
        """(param name prefix, checkpoint name fragment, expert id, shard id) for every expert.

        A model's load_weights replaces the fragment by the prefix, so
        "mlp.experts.3.up_proj.weight" becomes "mlp.experts.w13_weight", loaded as
        expert 3, shard "w3".
        """
        return [
            (
                "experts.w2_" if shard_id == "w2" else "experts.w13_",
                f"experts.{e}.{name}.",
                e,
                shard_id,
            )
            for e in range(num_experts)
            for shard_id, name in _CHECKPOINT_NAMES.items()
        ]

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
            f"intermediate_per_partition={self.intermediate_size_per_partition}, "
            f"renormalize={self.renormalize}"
        )
