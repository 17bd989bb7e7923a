"""A tiny checkpoint as transformers writes it, pagedllm's model of its config (built the
way the loader builds it: the registry's class for config.json's architecture), and the
reference mapping between the two: a fused parameter is its parts concatenated."""

import pytest
import torch
import transformers
from safetensors import safe_open
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import build_model
from pagedllm.model_loader.safetensors import iterate_safetensors_weights
from tests.models.tiny_models import save_tiny_model

Checkpoint = dict[str, torch.Tensor]

# Fused parameter -> its checkpoint parts, in the order they are stacked (vLLM's layout).
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def save_and_read(config: transformers.PretrainedConfig, folder: str) -> Checkpoint:
    """save_pretrained's tensors by name, in float32."""
    save_tiny_model(config, folder)
    return read_checkpoint(folder)


def read_checkpoint(folder: str) -> Checkpoint:
    return dict(iterate_safetensors_weights(folder, torch.float32))


def record_safetensors_reads(monkeypatch: pytest.MonkeyPatch, folder: str) -> list[str]:
    """The names of the tensors safetensors reads from the checkpoint in `folder` from now
    on, in order (the list fills as they are read)."""
    read: list[str] = []
    with safe_open(f"{folder}/model.safetensors", framework="pt") as f:
        handle_type = type(f)
    original = handle_type.get_tensor
    monkeypatch.setattr(
        handle_type, "get_tensor", lambda self, name: (read.append(name), original(self, name))[1]
    )
    return read


def empty_model(folder: str) -> nn.Module:
    """pagedllm's model for the checkpoint in `folder`, weights not loaded yet."""
    return build_model(ModelConfig.create(folder, dtype="float32"), "cpu")


def load(model: nn.Module, checkpoint: Checkpoint) -> nn.Module:
    with torch.no_grad():
        model.load_weights(checkpoint.items())
    return model


def expected_tensor(name: str, checkpoint: Checkpoint) -> torch.Tensor:
    """The checkpoint tensor(s) a dense parameter of ours is made of."""
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            return torch.cat([checkpoint[name.replace(fused, part)] for part in parts])
    return checkpoint[name]


def assert_loaded_from(model: nn.Module, checkpoint: Checkpoint, skip: str | None = None) -> None:
    """Every parameter (but those whose name contains `skip`) equals its checkpoint tensors."""
    for name, param in model.named_parameters():
        if skip is None or skip not in name:
            expected = expected_tensor(name, checkpoint)
            torch.testing.assert_close(param, expected, rtol=0, atol=0, msg=name)
