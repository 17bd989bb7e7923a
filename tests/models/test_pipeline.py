"""pagedllm/models/pipeline.py: each pipeline stage builds and loads only its share, and
the stages run one after another in this process (no process group) give the logits of
the whole model bit for bit (reference: the same model on one stage, float32)."""

import pytest
import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.distributed.parallel_state import override_pipeline_parallel
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.executor.batch import SeqChunk
from pagedllm.executor.model_runner import ModelRunner, StepInput
from pagedllm.model_loader.loader import get_model, iterate_weights
from pagedllm.models.pipeline import PPMissingLayer, weight_filter
from tests.models.checkpoints import record_safetensors_reads


def stage_model(path: str, rank: int, size: int) -> nn.Module:
    with override_pipeline_parallel(rank, size):
        return get_model(ModelConfig.create(path, dtype="float32"))


def param_bytes(model: nn.Module) -> dict[str, int]:
    return {n: p.numel() * p.element_size() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["llama-gqa4", "qwen3-moe"])
def test_stages_split_the_parameters_without_overlap(name: str, tiny_model_path) -> None:
    path = tiny_model_path(name)
    full = param_bytes(stage_model(path, 0, 1))
    first, last = (param_bytes(stage_model(path, r, 2)) for r in range(2))
    assert not set(first) & set(last)
    assert first | last == full
    assert "model.embed_tokens.weight" in first and "lm_head.weight" in last
    assert all(n.startswith("model.layers.1.") or "layers" not in n for n in last)


def test_a_tied_lm_head_holds_the_embedding_on_the_last_stage(tiny_model_path) -> None:
    path = tiny_model_path("llama-tied-mqa")
    last = stage_model(path, 1, 2)
    assert last.lm_head.weight is last.model.embed_tokens.weight
    assert isinstance(last.model.layers[0], PPMissingLayer)
    assert isinstance(stage_model(path, 0, 2).lm_head, PPMissingLayer)
    full = stage_model(path, 0, 1)
    assert torch.equal(last.lm_head.weight, full.lm_head.weight)


def test_other_stages_tensors_are_never_read(tiny_model_path, monkeypatch) -> None:
    """The name filter runs before safetensors reads a tensor."""
    path = tiny_model_path("llama-gqa4")
    read = record_safetensors_reads(monkeypatch, path)
    with override_pipeline_parallel(1, 2):
        model_config = ModelConfig.create(path, dtype="float32")
        stage = get_model(model_config)
    assert read and all(weight_filter(stage)(n) for n in read)
    assert not any(n.startswith(("model.layers.0.", "model.embed_tokens.")) for n in read)
    loaded = list(read)
    names = [n for n, _ in iterate_weights(model_config, keep=weight_filter(stage))]
    assert names == loaded


@pytest.mark.parametrize("name", ["llama-gqa4", "llama-tied-mqa", "qwen3", "qwen3-moe"])
def test_two_stages_in_turn_give_the_whole_models_logits(name: str, tiny_model_path) -> None:
    args = EngineArgs(
        tiny_model_path(name), dtype="float32", num_kv_blocks=16, block_size=4, device="cpu"
    )
    config = args.create_engine_config()
    config.enforce_eager = True
    runners = []
    for rank, size in ((0, 1), (0, 2), (1, 2)):
        with override_pipeline_parallel(rank, size):
            runners.append(ModelRunner(config))
            runners[-1].init_kv_cache(16)
    whole, first, last = runners
    chunks = [SeqChunk(list(range(5, 14)), 0, [0, 1, 2]), SeqChunk([7, 8, 9], 0, [3])]
    step = StepInput(chunks, [], [0, 1], [0])
    intermediate = first.forward_stage(step, None)
    assert set(intermediate.tensors) == {"hidden_states", "residual"}
    logits, prompt_logits = last.forward(step, intermediate)
    want, want_prompt = whole.forward(step)
    assert torch.equal(logits, want) and torch.equal(prompt_logits[0], want_prompt[0])
