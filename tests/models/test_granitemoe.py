"""pagedllm/models/granitemoe.py. References: the checkpoint transformers writes for
Granite MoE (each layer's experts fused, `block_sparse_moe.input_linear.weight` [E, 2 I, H]
and `output_linear.weight` [E, H, I], the router `block_sparse_moe.router.layer.weight`, as
the released ones hold them), loaded into each expert's w13 = [gate; up] and w2, whole or a
tensor-parallel rank's rows; its logits: tests/models/test_models_vs_transformers.py."""

from collections.abc import Callable

import pytest
import torch

from pagedllm.distributed.parallel_state import override_tensor_parallel
from pagedllm.models.granitemoe import GraniteMoeForCausalLM
from pagedllm.models.moe_block import SparseMoeBlock
from tests.models.checkpoints import assert_loaded_from, empty_model, load, read_checkpoint


def model_names(model: GraniteMoeForCausalLM, checkpoint: dict) -> dict[str, torch.Tensor]:
    """The checkpoint under the model's names, as the loader hands it to load_weights."""
    return {model.hf_to_pagedllm_mapper.map_name(name): t for name, t in checkpoint.items()}


def test_fused_experts_and_router_load(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("granitemoe")
    checkpoint = read_checkpoint(folder)
    block = "model.layers.1.block_sparse_moe."
    assert checkpoint[block + "input_linear.weight"].shape == (8, 64, 64)  # [E, 2 I, H]
    model = empty_model(folder)
    load(model, model_names(model, checkpoint))
    moe = model.model.layers[1].mlp
    assert isinstance(moe, SparseMoeBlock) and moe.experts.renormalize
    for name, param in [
        ("input_linear", moe.experts.w13_weight),
        ("output_linear", moe.experts.w2_weight),
        ("router.layer", moe.gate.weight),
    ]:
        torch.testing.assert_close(param, checkpoint[f"{block}{name}.weight"], rtol=0, atol=0)
    assert_loaded_from(model, checkpoint, skip=".mlp.")


def test_a_tensor_parallel_rank_takes_its_rows_of_each_expert(
    tiny_model_path: Callable[[str], str],
) -> None:
    """Rank 1 of 2: gate rows [16, 32) and up rows [48, 64) of input_linear, down columns
    [16, 32) of output_linear."""
    folder = tiny_model_path("granitemoe")
    checkpoint = read_checkpoint(folder)
    with override_tensor_parallel(1, 2):
        model = empty_model(folder)
        load(model, model_names(model, checkpoint))
    experts = model.model.layers[0].mlp.experts
    gate_up = checkpoint["model.layers.0.block_sparse_moe.input_linear.weight"]
    down = checkpoint["model.layers.0.block_sparse_moe.output_linear.weight"]
    expected = torch.cat([gate_up[:, 16:32], gate_up[:, 48:64]], dim=1)
    torch.testing.assert_close(experts.w13_weight, expected, rtol=0, atol=0)
    torch.testing.assert_close(experts.w2_weight, down[:, :, 16:32], rtol=0, atol=0)


def test_a_missing_fused_tensor_names_every_expert(tiny_model_path: Callable[[str], str]) -> None:
    folder = tiny_model_path("granitemoe")
    checkpoint = read_checkpoint(folder)
    del checkpoint["model.layers.0.block_sparse_moe.output_linear.weight"]
    model = empty_model(folder)
    with pytest.raises(ValueError, match="no weights for 8 parameters") as info:
        load(model, model_names(model, checkpoint))
    assert "model.layers.0.mlp.experts.w2_weight['w2', 0]" in str(info.value)
