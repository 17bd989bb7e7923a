"""pagedllm/model_loader/weight_arena.py: the model's CPU parameters move into one map with
the same values, shapes, strides and sharing, buffers stay where they are; the map asks for
huge pages until the copy's time budget is spent. Reference: a deep copy of the model taken
before the move."""

import copy
import pathlib
import weakref

import pytest
import torch
from torch import nn

from pagedllm.cpu_memory import huge_page_size
from pagedllm.model_loader import weight_arena
from pagedllm.model_loader.weight_arena import ALIGNMENT, move_weights_to_arena
from tests.memory_maps import mapping_of

PAGE = 2 << 20


class Mixed(nn.Module):
    """Tied embedding and head, a bf16 layer, a transposed weight, two parameters viewing one
    storage, a buffer held by two modules, an empty parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 1000, bias=False)
        self.head.weight = self.embed.weight
        self.bf16 = nn.Linear(64, 48, dtype=torch.bfloat16)
        self.transposed = nn.Parameter(torch.randn(96, 64).t())
        joint = torch.randn(10, 64)
        self.upper, self.lower = nn.Parameter(joint[:4]), nn.Parameter(joint[4:])
        self.empty = nn.Parameter(torch.empty(0))
        table = torch.randn(32, 8, dtype=torch.float64)
        self.a, self.b = nn.Module(), nn.Module()
        self.a.register_buffer("table", table)
        self.b.register_buffer("table", table)


@pytest.fixture
def thp(monkeypatch) -> None:
    """A 2 MiB huge page size whatever this machine's THP mode (the advice is a request)."""
    monkeypatch.setattr(weight_arena, "huge_page_size", lambda: PAGE)


def test_values_shapes_strides_and_sharing_survive_the_move(thp) -> None:
    """A generous budget: every parameter's storage moves; the buffer stays."""
    model = Mixed()
    reference, table = copy.deepcopy(model), model.a.table.data_ptr()
    arena, stats = move_weights_to_arena(model, budget_s=60.0)
    assert arena.data_ptr() % PAGE == 0
    assert stats.moved_bytes == stats.total_bytes == arena.numel()
    inside = range(arena.data_ptr(), arena.data_ptr() + arena.numel())
    moved, expected = dict(model.named_parameters()), dict(reference.named_parameters())
    assert moved.keys() == expected.keys()
    for name, tensor in moved.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
        assert tensor.stride() == expected[name].stride(), name
        assert tensor.numel() == 0 or tensor.data_ptr() in inside, name
    assert model.head.weight is model.embed.weight and isinstance(model.upper, nn.Parameter)
    assert model.lower.data_ptr() - model.upper.data_ptr() == 4 * 64 * 4
    assert model.a.table is model.b.table and model.a.table.data_ptr() == table
    torch.testing.assert_close(model.a.table, reference.a.table, rtol=0, atol=0)
    assert model.bf16.weight.data_ptr() % ALIGNMENT == 0
    if huge_page_size() is not None and pathlib.Path("/proc/self/smaps").exists():
        assert " hg" in mapping_of(arena.data_ptr())[1]  # MADV_HUGEPAGE


def test_a_buffer_two_models_share_ties_neither_to_the_other(thp) -> None:
    """get_rope gives models with the same rope settings one RotaryEmbedding, as vLLM does:
    had its table moved with the first model's weights, it would keep that whole map alive
    after the model is gone, and the second model would copy the first's map into its own."""
    shared = nn.Module()
    shared.register_buffer("table", torch.randn(16, 8))
    table = shared.table.data_ptr()
    first_arena, _ = move_weights_to_arena(nn.Sequential(nn.Linear(256, 256), shared), 60.0)
    _, second = move_weights_to_arena(nn.Sequential(nn.Linear(256, 256), shared), 60.0)
    assert shared.table.data_ptr() == table
    assert second.total_bytes == first_arena.numel()


def test_storages_past_the_budget_stay_where_they_are(thp, monkeypatch) -> None:
    """The clock passes the budget after the first storage (a 4 MiB weight): that one moves,
    the others keep their memory and values."""
    ticks = iter([0.0, 0.0] + [1.0] * 100)
    monkeypatch.setattr(weight_arena.time, "perf_counter", lambda: next(ticks))
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(3)))
    reference = copy.deepcopy(model)
    before = [p.data_ptr() for p in model.parameters()]
    arena, stats = move_weights_to_arena(model, budget_s=0.5)
    assert stats.moved_bytes == 4 << 20 and stats.total_bytes > 12 << 20
    assert model[0].weight.data_ptr() == arena.data_ptr()
    assert [p.data_ptr() for p in model.parameters()][1:] == before[1:]
    for moved, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(moved, expected, rtol=0, atol=0)


def test_budget_zero_moves_nothing(thp) -> None:
    model = nn.Linear(64, 64)
    before = model.weight.data_ptr()
    _, stats = move_weights_to_arena(model, budget_s=0.0)
    assert stats.moved_bytes == 0 and model.weight.data_ptr() == before


def test_nothing_moves_without_huge_pages(monkeypatch) -> None:
    monkeypatch.setattr(weight_arena, "huge_page_size", lambda: None)
    model = Mixed()
    before = model.bf16.weight.data_ptr()
    assert move_weights_to_arena(model) is None
    assert model.bf16.weight.data_ptr() == before


def test_meta_tensors_stay_where_they_are(thp) -> None:
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    assert move_weights_to_arena(model) is None
    assert model.weight.device.type == "meta"


def test_each_old_storage_is_freed_once_copied(thp, monkeypatch) -> None:
    """Memory at its peak holds the map and the weights not yet copied, not two copies."""
    model = nn.Sequential(*(nn.Linear(64, 64, bias=False) for _ in range(3)))
    old = [weakref.ref(p.untyped_storage()) for p in model.parameters()]
    alive = []
    real_move = weight_arena._move

    def move(slot, dest) -> None:
        alive.append([ref() is not None for ref in old])
        real_move(slot, dest)

    monkeypatch.setattr(weight_arena, "_move", move)
    move_weights_to_arena(model, budget_s=60.0)
    assert alive == [[True, True, True], [False, True, True], [False, False, True]]
    assert old[2]() is None
