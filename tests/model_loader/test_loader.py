"""pagedllm/model_loader/loader.py: weight_bytes counts what the model holds; a CPU model's
weights end in one map; weights that do not fit are a ValueError."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pagedllm.config import ModelConfig
from pagedllm.cpu_memory import huge_page_size
from pagedllm.model_loader import weight_arena
from pagedllm.model_loader.loader import build_model, get_model, weight_bytes


def test_weight_bytes_counts_tied_weights_once_and_buffers_on_request() -> None:
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    model = nn.ModuleList([embed, head, nn.Linear(4, 4, dtype=torch.float16)])
    model.register_buffer("table", torch.zeros(3, dtype=torch.float64))
    params = 10 * 4 * 4 + (16 + 4) * 2
    assert weight_bytes(model, buffers=False) == params
    assert weight_bytes(model) == params + 3 * 8


@pytest.mark.skipif(huge_page_size() is None, reason="no transparent huge pages")
def test_cpu_model_weights_are_moved_into_one_map(tiny_model_path, monkeypatch) -> None:
    """Every parameter a view of one storage (the map), with the values of the weights left
    where loading put them (the arena off); a second model of the same settings, which
    shares the first's rotary table (get_rope), gets a map of its own weights only."""
    config = ModelConfig.create(tiny_model_path("qwen3-moe"), dtype="float32")
    model, second = get_model(config), get_model(config)
    monkeypatch.setattr(weight_arena, "huge_page_size", lambda: None)
    reference = get_model(config)
    maps = [
        {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in m.parameters()}
        for m in (model, second)
    ]
    assert [len(m) for m in maps] == [1, 1] and [*maps[0].values()] == [*maps[1].values()]
    tensors = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
    for name, tensor in itertools.chain(reference.named_parameters(), reference.named_buffers()):
        torch.testing.assert_close(tensors[name], tensor, rtol=0, atol=0)


def test_dummy_weights_are_vllms_small_uniform_ones_and_read_nothing(
    tiny_model_path, tmp_path, monkeypatch
) -> None:
    """load_format="dummy" on a folder holding only config.json: every parameter uniform in
    [-1e-3, 1e-3) (not all equal), the same on every load; a GGUF's blocks cannot be dummy."""
    (tmp_path / "config.json").write_text(
        (Path(tiny_model_path("llama-gqa-llama3")) / "config.json").read_text()
    )
    config = ModelConfig.create(str(tmp_path), "float32", load_format="dummy")
    first, second = get_model(config), get_model(config)
    for (name, a), b in zip(first.named_parameters(), second.parameters(), strict=True):
        assert a.abs().max() <= 1e-3 and a.std() > 0, name
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="load_format 'wrong'"):
        ModelConfig.create(str(tmp_path), load_format="wrong")


def test_weights_that_cannot_be_allocated_are_a_value_error(tmp_path) -> None:
    """A [2^24, 2^22] float32 embedding is 256 TiB, past any machine's address space: torch's
    allocator fails, and the error names the model, not an alloc_cpu.cpp line."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2**22,
        "intermediate_size": 16,
        "num_attention_heads": 2**16,
        "num_hidden_layers": 1,
        "vocab_size": 2**24,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model_config = ModelConfig.create(str(path), dtype="float32")
    with pytest.raises(ValueError, match=r"cannot allocate the weights of .*config.json.* on cpu"):
        build_model(model_config, "cpu")
