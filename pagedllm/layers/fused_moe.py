"""Mixture-of-experts feed-forward: top-k router plus SwiGLU experts, as in vLLM's FusedMoE.

Experts are held fused: w13 stacks each expert's gate and up rows, w2 its down matrix. For
tensor parallelism each expert's intermediate dimension is split across ranks, so rank r
holds gate/up rows and down columns [r*I/P, (r+1)*I/P) and the partial outputs are summed.

With expert parallelism (vLLM's enable_expert_parallel; the EP group is the TP group) each
rank holds whole experts instead: a contiguous run of them (determine_expert_map), so a
quantized expert's rows keep every block. Every rank routes all of its tokens (the router
is replicated, and the tokens are the same on every TP rank), runs its own experts on the
tokens routed to them, and the all-reduce the TP layer does anyway sums the ranks'
partial outputs: vLLM's naive dispatch for this case, no all-to-all, since each rank
already holds every token.

The expert weights belong to the layer's quant method, whose `apply` runs them all. By
default (apply_experts) the flat (token, expert) assignments are grouped by expert, so
each active expert runs one matmul over all of its tokens through the method's
apply_expert: 8 small ones for a decode token routed to 8 of 128 experts, a few large
ones for a prefill batch (float, or quantized blocks kept per expert). Float experts on a
GPU run instead as vLLM's fused_experts, two grouped Triton GEMMs for all experts
(_triton_ops/fused_moe.py), picked when the weights are processed (`moe_kernel`); under
expert parallelism it takes the layer's expert_map.
"""

import re

import torch
from torch import nn

from pagedllm._custom_ops.fused_moe import MoEKernel, topk_softmax
from pagedllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from pagedllm.distributed.parallel_state import (
    get_expert_parallel_rank,
    get_expert_parallel_world_size,
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
_CHECKPOINT_EXPERT = re.compile(rf"(.+)\.(\d+)\.(?:{'|'.join(_CHECKPOINT_NAMES.values())})\.")


def checkpoint_expert(name: str) -> tuple[str, int] | None:
    """(FusedMoE module name, expert id) of a per-expert checkpoint tensor:
    "model.layers.3.mlp.experts.5.up_proj.weight" -> ("model.layers.3.mlp.experts", 5);
    None for any other name."""
    match = _CHECKPOINT_EXPERT.match(name)
    return None if match is None else (match.group(1), int(match.group(2)))


def local_expert_range(ep_size: int, ep_rank: int, global_num_experts: int) -> range:
    """The experts rank `ep_rank` of `ep_size` holds, as vLLM places them: a contiguous run,
    E // ep_size each and one more on the first E % ep_size ranks."""
    base, remainder = divmod(global_num_experts, ep_size)
    start = ep_rank * base + min(ep_rank, remainder)
    return range(start, start + base + (1 if ep_rank < remainder else 0))


def determine_expert_map(
    ep_size: int, ep_rank: int, global_num_experts: int
) -> tuple[int, torch.Tensor | None]:
    """vLLM's name: the number of experts rank `ep_rank` holds, and its expert map [E]
    int32, global expert id -> local index, -1 for experts held elsewhere (None when
    ep_size is 1: every expert is local)."""
    if ep_size == 1:
        return global_num_experts, None
    local = local_expert_range(ep_size, ep_rank, global_num_experts)
    expert_map = torch.full((global_num_experts,), -1, dtype=torch.int32)
    expert_map[local.start : local.stop] = torch.arange(len(local), dtype=torch.int32)
    return len(local), expert_map


class FusedMoE(InferenceModule):
    """Routed experts of one MoE block.

    w13_weight: [E_local, 2 * I_p, H], gate rows then up rows of this rank's shard.
    w2_weight:  [E_local, H, I_p].

    Under tensor parallelism E_local = E and I_p = I / tp; under expert parallelism
    E_local is this rank's share of the experts (local_num_experts, expert_map) and I_p = I.
    """

    quant_kind = LayerKind.FUSED_MOE

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
        self.num_experts = num_experts
        self._place_experts()
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
        try:
            self.quant_method.create_weights(
                self,
                self.local_num_experts,
                hidden_size,
                self.intermediate_size_per_partition,
                torch.get_default_dtype(),
                weight_loader=self.weight_loader,
            )
        except ValueError as e:  # a slice of an expert's quantized rows would cut a block
            if self.tp_size == 1:
                raise
            raise ValueError(f"{e}; enable_expert_parallel keeps every expert whole") from e

    def _place_experts(self) -> None:
        """Which experts this rank holds and how much of each: all of them, each split over
        the TP ranks (tp_rank, tp_size), or, under expert parallelism, a run of whole ones
        (ep_rank, ep_size, local_experts, expert_map; tp_size 1 within an expert)."""
        self.ep_rank = get_expert_parallel_rank()
        self.ep_size = get_expert_parallel_world_size()
        if self.num_experts < self.ep_size:
            raise ValueError(
                f"expert parallelism over {self.ep_size} ranks needs at least one expert "
                f"per rank; the model has {self.num_experts} experts"
            )
        expert_parallel = self.ep_size > 1
        self.tp_rank = 0 if expert_parallel else get_tensor_model_parallel_rank()
        self.tp_size = 1 if expert_parallel else get_tensor_model_parallel_world_size()
        self.local_experts = local_expert_range(self.ep_size, self.ep_rank, self.num_experts)
        self.local_num_experts, expert_map = determine_expert_map(
            self.ep_size, self.ep_rank, self.num_experts
        )
        self.expert_map: torch.Tensor | None
        self.register_buffer("expert_map", expert_map, persistent=False)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str, expert_id: int
    ) -> None:
        """Load one expert's full checkpoint matrix and keep this rank's slice of it: its
        rows of the intermediate dimension, or, under expert parallelism, the whole matrix
        when the expert is this rank's and nothing (after the same checks) when not (the
        loader does not read those: models/rank_weights.py).

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
        if expert_id not in self.local_experts:
            return
        source = shard_of(loaded_weight, split_dim, self.tp_rank, shard, self.tp_size, block)
        target = param.data[expert_id - self.local_experts.start]
        if shard_id != "w2":
            target = target.narrow(0, 0 if shard_id == "w1" else shard, shard)
        copy_weight(target, source, what)

    @property
    def syncs_host(self) -> bool:
        """Whether the forward reads the device on the host, which a CUDA graph cannot
        record: the per-expert loop reads each expert's token count (one sync a layer); the
        Triton fused kernel keeps them on the device."""
        return getattr(self, "moe_kernel", None) is not MoEKernel.TRITON

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """[T, H] hidden states and [T, E] router logits -> [T, H] (summed over ranks)."""
        topk_weights, topk_ids = self.select_experts(router_logits, hidden_states.dtype)
        out = self.quant_method.apply(self, hidden_states, topk_weights, topk_ids)
        if self.reduce_results and (self.tp_size > 1 or self.ep_size > 1):
            out = tensor_model_parallel_all_reduce(out)
        return out

    def select_experts(
        self, router_logits: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax in float32, top-k, optional renormalisation: [T, K] weights and expert ids
        (`_custom_ops.topk_softmax`)."""
        return topk_softmax(router_logits, self.top_k, self.renormalize, dtype)

    def apply_experts(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """Run each active local expert once over its tokens; [T, H] -> [T, H] weighted sum.

        The T*K assignments are sorted by local expert so each expert's rows are
        contiguous, assignments to other ranks' experts (local id -1) first, left zero; the
        per-expert counts cross to the host in one sync. The results are put back in
        (token, k) order and summed with the routing weights by one bmm, in the same order
        for every token, rather than by index_add_: its duplicate-index path on CPU
        (torch 2.13, 2 threads) took 10-70 ms for a single decode token.
        """
        num_tokens = hidden_states.shape[0]
        flat_ids = topk_ids.flatten()
        if self.expert_map is not None:
            flat_ids = self.expert_map[flat_ids]  # local ids, -1: another rank's expert
        order = torch.argsort(flat_ids, stable=True)  # sorted position -> flat (token, k)
        counts = torch.bincount(flat_ids + 1, minlength=self.local_num_experts + 1).tolist()
        elsewhere = counts[0]
        x = hidden_states.index_select(0, order[elsewhere:] // self.top_k)  # grouped by expert
        y = x.new_empty(order.shape[0], self.hidden_size)  # [T*K, H] in sorted order
        y[:elsewhere] = 0
        start = 0  # in x; y's rows are `elsewhere` further on
        for expert_id, count in enumerate(counts[1:]):
            if count == 0:
                continue
            end = start + count
            out = self.quant_method.apply_expert(self, x[start:end], expert_id)
            y[elsewhere + start : elsewhere + end] = out
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
            f"local_experts={self.local_num_experts}, "
            f"intermediate_per_partition={self.intermediate_size_per_partition}, "
            f"renormalize={self.renormalize}"
        )
