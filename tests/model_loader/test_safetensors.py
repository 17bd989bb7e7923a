"""Safetensors loading: sharded checkpoints, dtypes, and errors naming the file."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedllm import _custom_ops, _torch_ops
from pagedllm.config import ModelConfig
from pagedllm.model_loader.loader import get_model
from pagedllm.model_loader.safetensors import iterate_safetensors_weights, safetensors_files
from tests.models.tiny_models import save_tiny_model, tiny_configs


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE saved in several shards with model.safetensors.index.json."""
    import transformers

    folder = tmp_path_factory.mktemp("sharded")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_configs()["qwen3-moe"])
    model.save_pretrained(folder, max_shard_size="100KB")
    return folder


def test_sharded_checkpoint_reads_every_shard_once(sharded: Path) -> None:
    """Reference: the index's weight_map names every tensor and its file."""
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = safetensors_files(str(sharded))
    assert len(files) == len(set(index["weight_map"].values())) > 1
    names = [name for name, _ in iterate_safetensors_weights(str(sharded), torch.float32)]
    assert sorted(names) == sorted(index["weight_map"])


def test_sharded_checkpoint_loads_and_matches_the_unsharded_one(sharded: Path, tmp_path) -> None:
    save_tiny_model(tiny_configs()["qwen3-moe"], str(tmp_path))
    a = get_model(ModelConfig.create(str(sharded), dtype="float32"))
    b = get_model(ModelConfig.create(str(tmp_path), dtype="float32"))
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


def test_missing_shard_is_named(sharded: Path, tmp_path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(sharded, folder)
    victim = sorted(folder.glob("*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(ValueError, match=victim.name):
        safetensors_files(str(folder))


def test_truncated_file_is_named(tiny_model_path, tmp_path) -> None:
    folder = tmp_path / "truncated"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        get_model(ModelConfig.create(str(folder), dtype="float32"))


def test_extra_checkpoint_tensor_is_named(tiny_model_path, tmp_path) -> None:
    folder = tmp_path / "extra"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.surprise.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match="surprise.weight"):
        get_model(ModelConfig.create(str(folder), dtype="float32"))


def test_shape_mismatch_is_named(tiny_model_path, tmp_path) -> None:
    folder = tmp_path / "shape"
    shutil.copytree(tiny_model_path("llama-gqa4"), folder)
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{name}.*shape"):
        get_model(ModelConfig.create(str(folder), dtype="float32"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_load_in_that_dtype_close_to_fp32(tiny_model_path, dtype: str) -> None:
    """Reference: the fp32 weights rounded to the dtype (the fp32 linears' weights may be in
    the avx2 build's panels: compared unpacked; the half ones may be packed into AMX tiles
    or skinny_gemm_bf16's tile order: compared with the rounded weights packed the same
    way)."""
    path = tiny_model_path("llama-gqa4")
    fp32 = get_model(ModelConfig.create(path, dtype="float32"))
    half = get_model(ModelConfig.create(path, dtype=dtype))
    for (name, p), (_, q) in zip(fp32.state_dict().items(), half.state_dict().items(), strict=True):
        assert q.dtype == getattr(torch, dtype), name
        p = (_torch_ops.unpack_skinny(p) if p.dim() == 3 and q.dim() == 2 else p).to(q.dtype)
        p = _custom_ops.prepack_linear_weight(p) if q.dim() == 4 and p.dim() == 2 else p
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
