"""pagedllm/models/rank_weights.py: under expert parallelism a rank never reads (nor, from a
GGUF file, dequantizes) another rank's experts, and holds the same weights bit for bit as
when it read every expert and dropped the others'. References: vLLM's expert placement
(local_expert_range), the file's own bytes, and the load with only the pipeline's filter."""

import re
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.gguf import reader, tensor_names
from pagedllm.gguf.reader import TensorInfo, read_gguf
from pagedllm.layers.fused_moe import local_expert_range
from pagedllm.model_loader import loader
from pagedllm.model_loader.loader import build_model, get_model
from pagedllm.models import pipeline
from pagedllm.models.rank_weights import rank_weight_filter
from tests.layers.quantization.quantized_gguf import write_quantized_gguf
from tests.layers.test_fused_moe_expert_parallel import ep_rank
from tests.models.checkpoints import record_safetensors_reads

EXPERT = re.compile(r"\.experts\.(\d+)\.")


def expert_of(name: str) -> int | None:
    match = EXPERT.search(name)
    return None if match is None else int(match.group(1))


def checkpoint_names(folder: str) -> list[str]:
    with safe_open(f"{folder}/model.safetensors", framework="pt") as f:
        return list(f.keys())


def reading_every_expert(config: ModelConfig, monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    """The rank's model loaded with only the pipeline's filter: every expert read, then the
    other ranks' dropped by FusedMoE.weight_loader."""
    with monkeypatch.context() as patch:
        patch.setattr(loader, "rank_weight_filter", pipeline.weight_filter)
        return get_model(config)


def assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    params, expected = dict(model.named_parameters()), dict(reference.named_parameters())
    assert params.keys() == expected.keys()
    for name, param in params.items():
        assert torch.equal(param, expected[name]), name


@pytest.mark.parametrize("rank, size", [(0, 1), (1, 2), (2, 4), (3, 4)])
def test_filter_keeps_this_ranks_experts_and_every_other_tensor(
    rank: int, size: int, tiny_model_path
) -> None:
    path = tiny_model_path("qwen3-moe")  # 8 experts in layer 0; layer 1 dense
    names = checkpoint_names(path)
    with ep_rank(rank, size):
        keep = rank_weight_filter(build_model(ModelConfig.create(path, "float32"), "meta"))
    local = local_expert_range(size, rank, 8)
    kept = [n for n in names if keep(n)]
    assert kept == [n for n in names if expert_of(n) is None or expert_of(n) in local]
    assert len([n for n in kept if expert_of(n) is not None]) == 3 * len(local)


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral"])  # mixtral: block_sparse_moe.*.w1
@pytest.mark.parametrize("rank, size", [(1, 2), (2, 4)])
def test_safetensors_other_ranks_experts_are_never_read(
    rank: int, size: int, name: str, tiny_model_path, monkeypatch
) -> None:
    path = tiny_model_path(name)
    config = ModelConfig.create(path, "float32")
    read = record_safetensors_reads(monkeypatch, path)
    with ep_rank(rank, size):
        model = get_model(config)
        read_experts = {expert_of(n) for n in read} - {None}
        assert read_experts == set(local_expert_range(size, rank, 8))
        keep = model.hf_to_pagedllm_mapper.keep(rank_weight_filter(model))  # checkpoint names
        assert sorted(read) == sorted(n for n in checkpoint_names(path) if keep(n))
        assert_same_weights(model, reading_every_expert(config, monkeypatch))


NUM_EXPERTS = 6


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen3-MoE GGUF, 2 MoE layers of 6 experts: gate/up Q5_1, down Q4_K."""
    path = str(tmp_path_factory.mktemp("moe") / "qwen3moe.gguf")
    write_quantized_gguf(path, "qwen3moe", num_experts=NUM_EXPERTS)
    return path


Reads = list[tuple[str, TensorInfo]]


def record_gguf_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[Reads, list[int]]:
    """(every tensor part the iterator reads, by "read_tensor" (to dequantize) or
    "read_blocks" (as stored); the bytes handed to the dequantizer, call by call), filled as
    the file is read."""
    reads: Reads = []
    dequantized: list[int] = []
    for read in ("read_tensor", "read_blocks"):
        original = getattr(tensor_names, read)

        def recorded(g, info: TensorInfo, read: str = read, f=original) -> torch.Tensor:
            reads.append((read, info))
            return f(g, info)

        monkeypatch.setattr(tensor_names, read, recorded)
    dequantize = reader.dequantize

    def recorded_dequantize(data: np.ndarray, qtype: int) -> np.ndarray:
        dequantized.append(data.nbytes)
        return dequantize(data, qtype)

    monkeypatch.setattr(reader, "dequantize", recorded_dequantize)
    return reads, dequantized


def expert_stacks(path: str) -> Iterator[TensorInfo]:
    return (info for info in read_gguf(path).tensors.values() if info.name.endswith("_exps.weight"))


@pytest.mark.parametrize("quantization", ["gguf", "none"])  # blocks as stored; dequantized
@pytest.mark.parametrize("rank, size", [(2, 4), (0, 4), (1, 2)])
def test_gguf_reads_and_dequantizes_only_this_ranks_experts_rows(
    quantization: str, rank: int, size: int, moe_gguf: str, monkeypatch
) -> None:
    """Each stacked expert tensor is read once, as the rank's run of experts, and nothing
    else of it reaches the dequantizer."""
    config = ModelConfig.create(moe_gguf, "float32", quantization=quantization)
    local = local_expert_range(size, rank, NUM_EXPERTS)
    with monkeypatch.context() as patch:
        reads, dequantized = record_gguf_reads(patch)
        with ep_rank(rank, size):
            model = get_model(config)
    expert_reads = {info.name: info for _, info in reads if info.name.endswith("_exps.weight")}
    stacks = list(expert_stacks(moe_gguf))
    assert len(expert_reads) == len(stacks) == 6
    assert len(reads) == len({info.name for _, info in reads}), "each tensor read once"
    for stack in stacks:
        per_expert = stack.nbytes // NUM_EXPERTS
        part = expert_reads[stack.name]
        assert part.shape == (len(local), *stack.shape[1:])
        assert (part.start, part.nbytes) == (
            stack.start + local.start * per_expert,
            len(local) * per_expert,
        )
    assert sum(dequantized) == sum(info.nbytes for read, info in reads if read == "read_tensor")
    experts_read_as = {read for read, info in reads if info.name in expert_reads}
    assert experts_read_as == {"read_tensor" if quantization == "none" else "read_blocks"}
    with ep_rank(rank, size):
        assert_same_weights(model, reading_every_expert(config, monkeypatch))
