"""FusedMoE against transformers' Qwen3MoeSparseMoeBlock (the reference), loaded per expert."""

import pytest
import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from pagedllm import _cpu_kernels
from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.layers.fused_moe import FusedMoE


def make_block(num_experts: int, top_k: int, hidden: int, inter: int, norm: bool):
    config = Qwen3MoeConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm,
    )
    config._experts_implementation = "eager"  # the per-expert loop, the plain reference
    block = Qwen3MoeSparseMoeBlock(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return block


def checkpoint_of(block: Qwen3MoeSparseMoeBlock) -> dict[str, torch.Tensor]:
    """Per-expert tensors as a checkpoint stores them: gate/up [I, H], down [H, I].

    transformers fuses gate_up_proj[e] = cat(gate_proj, up_proj) along rows; down_proj[e]
    is the expert's down_proj weight unchanged.
    """
    experts = block.experts
    inter = experts.intermediate_dim
    tensors = {}
    for e in range(experts.num_experts):
        gate_up = experts.gate_up_proj[e].detach()
        tensors[f"mlp.experts.{e}.gate_proj.weight"] = gate_up[:inter].clone()
        tensors[f"mlp.experts.{e}.up_proj.weight"] = gate_up[inter:].clone()
        tensors[f"mlp.experts.{e}.down_proj.weight"] = experts.down_proj[e].detach().clone()
    return tensors


def load(layer: FusedMoE, checkpoint: dict[str, torch.Tensor]) -> None:
    """The way a model's load_weights uses the expert mapping."""
    params = dict(layer.named_parameters(prefix="mlp.experts"))
    mapping = FusedMoE.make_expert_params_mapping(layer.num_experts)
    for name, tensor in checkpoint.items():
        matches = [m for m in mapping if m[1] in name]
        assert len(matches) == 1, name
        prefix, fragment, expert_id, shard_id = matches[0]
        param = params[name.replace(fragment, prefix)]
        param.weight_loader(param, tensor, shard_id=shard_id, expert_id=expert_id)


def fused_like(block: Qwen3MoeSparseMoeBlock, **kwargs: bool) -> FusedMoE:
    experts, gate = block.experts, block.gate
    layer = FusedMoE(
        experts.num_experts,
        gate.top_k,
        experts.hidden_dim,
        experts.intermediate_dim,
        renormalize=gate.norm_topk_prob,
        **kwargs,
    )
    load(layer, checkpoint_of(block))
    return layer


def inputs(block: Qwen3MoeSparseMoeBlock, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, block.experts.hidden_dim, generator=generator)
    return x, torch.nn.functional.linear(x, block.gate.weight)


@pytest.mark.parametrize("num_tokens", [1, 37])
@pytest.mark.parametrize(
    "num_experts, top_k, hidden, inter, norm",
    [(8, 2, 32, 16, True), (8, 2, 32, 16, False), (128, 8, 16, 8, True)],
)
@torch.no_grad()
def test_matches_transformers_qwen3_moe_block(
    num_experts: int, top_k: int, hidden: int, inter: int, norm: bool, num_tokens: int
) -> None:
    block = make_block(num_experts, top_k, hidden, inter, norm)
    layer = fused_like(block)
    x, router_logits = inputs(block, num_tokens)
    expected = block(x.unsqueeze(0)).squeeze(0)
    actual = layer(x, router_logits)
    assert actual.shape == (num_tokens, hidden)
    assert (actual - expected).abs().max().item() <= 1e-5


@torch.no_grad()
def test_tensor_parallel_shards_sum_to_full_output() -> None:
    """Reference: the tp=1 layer; ranks 0 and 1 of 2 each hold half of every expert."""
    block = make_block(8, 2, 32, 16, True)
    x, router_logits = inputs(block, 37)
    expected = fused_like(block)(x, router_logits)
    partials = []
    for rank in range(2):
        with override_tensor_parallel(rank, 2):
            layer = fused_like(block, reduce_results=False)
        assert layer.w13_weight.shape == (8, 16, 32)
        assert layer.w2_weight.shape == (8, 32, 8)
        partials.append(layer(x, router_logits))
    assert not torch.allclose(partials[0], expected, atol=1e-3)
    assert (partials[0] + partials[1] - expected).abs().max().item() <= 1e-5


def test_indivisible_intermediate_size_raises() -> None:
    with override_tensor_parallel(0, 3), pytest.raises(ValueError, match="16.*3"):
        FusedMoE(8, 2, 32, 16)


def test_top_k_out_of_range_raises() -> None:
    with pytest.raises(ValueError, match="top_k 9"):
        FusedMoE(8, 9, 32, 16)


def test_weight_loader_rejects_bad_shape_shard_and_expert() -> None:
    layer = FusedMoE(8, 2, 32, 16)
    param = layer.w13_weight
    with pytest.raises(ValueError, match=r"expert 3 gate_proj shape mismatch.*\(32, 16\)"):
        layer.weight_loader(param, torch.zeros(32, 16), shard_id="w1", expert_id=3)
    with pytest.raises(ValueError, match="shard_id 'w4'"):
        layer.weight_loader(param, torch.zeros(16, 32), shard_id="w4", expert_id=3)
    with pytest.raises(ValueError, match=r"expert_id 8 must be in \[0, 8\)"):
        layer.weight_loader(param, torch.zeros(16, 32), shard_id="w1", expert_id=8)


def test_expert_params_mapping() -> None:
    """Reference: vLLM's FusedMoE.make_expert_params_mapping naming."""
    mapping = FusedMoE.make_expert_params_mapping(4)
    assert len(mapping) == 12
    assert ("experts.w13_", "experts.3.gate_proj.", 3, "w1") in mapping
    assert ("experts.w13_", "experts.3.up_proj.", 3, "w3") in mapping
    assert ("experts.w2_", "experts.0.down_proj.", 0, "w2") in mapping
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    hits = [(p, f, e, s) for p, f, e, s in mapping if f in name]
    assert len(hits) == 1
    prefix, fragment, expert_id, shard_id = hits[0]
    assert name.replace(fragment, prefix) == "model.layers.0.mlp.experts.w13_weight"
    assert (expert_id, shard_id) == (3, "w3")


def test_empty_batch_returns_empty() -> None:
    layer = FusedMoE(8, 2, 32, 16)
    out = layer(torch.zeros(0, 32), torch.zeros(0, 8))
    assert out.shape == (0, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_experts_packed_at_load_keep_the_layers_bits(
    dtype: torch.dtype, skinny_gemm_isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """process_weights_after_loading packs each expert's matrices in the order the build
    reads, where it reads one (float32 panels on avx2, bf16 tiles on avx512_bf16), stacked,
    expert e still at [e]. Reference: the same layer on its plain weights, bit for bit."""
    monkeypatch.setattr(_cpu_kernels, "amx_available", lambda: False)
    block = make_block(8, 2, 32, 32, True)
    layer = fused_like(block)
    for param in (layer.w13_weight, layer.w2_weight):
        param.data = param.data.to(dtype)
    x, router_logits = inputs(block, 37)
    x = x.to(dtype)
    plain = layer(x, router_logits)
    layer.quant_method.process_weights_after_loading(layer)
    packed = _cpu_kernels.skinny_gemm_reads_packed(dtype)
    assert layer.w13_weight.dim() == (2 if not packed else 4 if dtype is torch.bfloat16 else 3) + 1
    assert torch.equal(layer(x, router_logits), plain)
