"""pagedllm/models/glm4.py beyond the shared comparison with transformers
(test_models_vs_transformers.py): how GLM-4's checkpoint maps onto the model (reference:
the tensors transformers' save_pretrained writes, and Glm4Attention's and Glm4Config's
layout: q/k/v biases and none on o_proj, half of each head rotated in adjacent pairs)."""

import torch

from tests.models.checkpoints import empty_model, load, read_checkpoint


def test_the_checkpoints_tensors_are_the_models(tiny_model_path) -> None:
    folder = tiny_model_path("glm4")
    checkpoint = read_checkpoint(folder)
    assert "model.layers.0.mlp.gate_up_proj.weight" in checkpoint
    assert "model.layers.0.self_attn.o_proj.bias" not in checkpoint
    model = load(empty_model(folder), checkpoint)
    params = dict(model.named_parameters())
    for name, tensor in checkpoint.items():
        if ".self_attn." in name and name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj"):
            continue  # fused into qkv_proj: the shared comparison checks their outputs
        torch.testing.assert_close(params[name], tensor, rtol=0, atol=0, msg=name)


def test_half_of_each_head_turns_in_adjacent_pairs(tiny_model_path) -> None:
    attn = empty_model(tiny_model_path("glm4")).model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    rope = attn.rotary_emb
    assert (rope.head_size, rope.rotary_dim, rope.is_neox_style) == (32, 16, False)
