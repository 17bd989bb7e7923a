"""pagedllm/lora/model_manager.py on the tiny Llama built as the engine builds it (get_model).
References: PEFT's adapted modules (the PeftModel that wrote each folder, on the same
checkpoint) for what a layer computes per row; the model class's lora_target_shapes for
which layers hold slots; least-recently-used order, by hand, for slots and the host cache,
whose disk reads a spy on load_lora_weights counts."""

from collections.abc import Callable

import pytest
import torch
from peft import PeftModel

from pagedllm.config import LoRAConfig, ModelConfig
from pagedllm.lora import layers as lora_layers
from pagedllm.lora import model_manager as manager_module
from pagedllm.lora.model_manager import LoRAModelManager
from pagedllm.lora.request import LoRARequest
from pagedllm.model_loader.loader import get_model
from tests.lora.peft_folders import PREFIX, save_adapter
from tests.models.tiny_models import tiny_configs

MODEL = "llama-gqa4"
NUM_ADAPTERS = 3


@pytest.fixture(scope="module")
def adapters(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[LoRARequest, PeftModel]]:
    """Three adapters (ids 1, 2, 3) of ranks 2, 4, 3, the first on attention only."""
    made = []
    kwargs = [{"r": 2, "target_modules": ["q_proj", "v_proj", "o_proj"]}, {"r": 4}, {"r": 3}]
    for i, lora_kwargs in enumerate(kwargs):
        folder = str(tmp_path_factory.mktemp(f"adapter{i + 1}"))
        model = save_adapter(tiny_model_path(MODEL), folder, seed=i, lora_alpha=8, **lora_kwargs)
        made.append((LoRARequest(f"adapter{i + 1}", i + 1, folder), model))
    return made


@pytest.fixture
def requests(adapters: list[tuple[LoRARequest, PeftModel]]) -> list[LoRARequest]:
    return [request for request, _ in adapters]


@pytest.fixture
def disk_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The adapter folders the manager reads weights from, from now on."""
    paths: list[str] = []
    original = manager_module.load_lora_weights

    def spy(adapter: object) -> object:
        paths.append(adapter.path)
        return original(adapter)

    monkeypatch.setattr(manager_module, "load_lora_weights", spy)
    return paths


def new_manager(
    tiny_model_path: Callable[[str], str], name: str = MODEL, **lora: int
) -> LoRAModelManager:
    model = get_model(ModelConfig.create(tiny_model_path(name), dtype="float32"))
    config = LoRAConfig(**{"max_loras": 2, "max_lora_rank": 4, **lora})
    return LoRAModelManager(model, config, torch.float32, torch.device("cpu"))


def run_step(manager: LoRAModelManager, *step: LoRARequest) -> list[int | None]:
    """A step with one chunk of each adapter; the adapter ids each slot holds after it."""
    with manager.activate(
        {r.lora_int_id: r for r in step}, [r.lora_int_id for r in step], [1] * len(step)
    ):
        pass
    return [None if key is None else key[0] for key in manager.slots]


@pytest.mark.parametrize("name", list(tiny_configs()))
def test_every_target_of_the_model_class_has_slots_of_its_shape(
    name: str, tiny_model_path: Callable[[str], str]
) -> None:
    """Each module of lora_target_shapes is in exactly one layer's slots, in its fused
    order (q, k, v; gate, up), the layer's input and output its (in, out) and the sum of
    its parts' outs; Qwen3-MoE's sparse layer 0 has no dense MLP to adapt."""
    manager = new_manager(tiny_model_path, name)
    modules = [m for _, subs in manager.layers for m in subs]
    assert sorted(modules) == sorted(manager.target_shapes)
    qkv = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert qkv in [subs for _, subs in manager.layers]
    assert ("model.layers.0.mlp.gate_proj" in modules) is (name != "qwen3-moe")
    for slots, subs in manager.layers:
        assert slots.layer.lora is slots
        shapes = [manager.target_shapes[m] for m in subs]
        assert {in_features for in_features, _ in shapes} == {slots.layer.input_size}
        assert sum(out for _, out in shapes) == slots.layer.output_size


def test_slots_are_reused_least_recently_used_first(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest], disk_loads: list[str]
) -> None:
    a, b, c = requests
    manager = new_manager(tiny_model_path, max_cpu_loras=3)
    assert run_step(manager, a) == [1, None]
    assert run_step(manager, b) == [1, 2]
    assert run_step(manager, a) == [1, 2]  # a is now the most recent
    assert run_step(manager, c) == [1, 3]  # b's slot
    assert run_step(manager, b) == [2, 3]  # a's slot
    assert disk_loads == [a.path, b.path, c.path]  # b reloaded from host memory


def test_a_slot_the_step_uses_is_never_taken(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest]
) -> None:
    """a's slot is the least recent one when c needs a slot, but a runs in the same step."""
    a, b, c = requests
    manager = new_manager(tiny_model_path)
    run_step(manager, a)
    run_step(manager, b)
    assert run_step(manager, c, a) == [1, 3]
    assert run_step(manager, b, c) == [2, 3]


def test_the_host_cache_keeps_max_cpu_loras_adapters(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest], disk_loads: list[str]
) -> None:
    a, b, c = requests
    manager = new_manager(tiny_model_path, max_loras=1, max_cpu_loras=2)
    for step in [a, b, a, c, a, b]:
        run_step(manager, step)
        assert len(manager.cpu_cache) <= 2
    # a from memory; c evicts b (a was used since); b evicted, read again
    assert disk_loads == [a.path, b.path, c.path, b.path]
    assert list(manager.cpu_cache) == [(1, a.path), (2, b.path)]


def test_activate_maps_each_chunk_s_rows_to_its_slot(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest]
) -> None:
    a, b, _ = requests
    manager = new_manager(tiny_model_path)
    run_step(manager, b)  # b in slot 0, a will take slot 1
    with manager.activate({1: a, 2: b}, [1, 0, 2, 1], [2, 1, 3, 1]):
        step_slots = lora_layers._step_slots
        assert [slot for slot, _ in step_slots] == [0, 1]
        rows = {slot: mask.squeeze(1).tolist() for slot, mask in step_slots}
        assert rows[1] == [True, True, False, False, False, False, True]
        assert rows[0] == [False, False, False, True, True, True, False]
    assert lora_layers._step_slots == []


def test_rows_all_of_one_adapter_need_no_mask(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest]
) -> None:
    manager = new_manager(tiny_model_path)
    with manager.activate({1: requests[0]}, [1, 1], [3, 2]):
        assert lora_layers._step_slots == [(0, None)]


def test_base_rows_only_map_to_no_slot(
    tiny_model_path: Callable[[str], str], requests: list[LoRARequest]
) -> None:
    manager = new_manager(tiny_model_path)
    with manager.activate({1: requests[0]}, [0, 0], [3, 2]):
        assert lora_layers._step_slots == []


def test_each_layer_computes_peft_s_adapted_modules_per_row(
    tiny_model_path: Callable[[str], str], adapters: list[tuple[LoRARequest, PeftModel]]
) -> None:
    """Rows of adapter 1 (attention only), of adapter 2 (everything) and of none, in one
    step: each fused layer's output is PEFT's modules' outputs concatenated."""
    (a, peft_a), (b, peft_b), _ = adapters
    manager = new_manager(tiny_model_path)
    peft = {
        None: dict(peft_a.named_modules()),
        1: dict(peft_a.named_modules()),
        2: dict(peft_b.named_modules()),
    }
    row_ids = [2, 2, None, 1, 1, 1]
    with manager.activate({1: a, 2: b}, [2, 0, 1], [2, 1, 3]), torch.no_grad():
        for slots, modules in manager.layers:
            x = torch.randn(len(row_ids), slots.layer.input_size)
            out = slots.layer(x)
            for row, lora_id in enumerate(row_ids):
                parts = []
                for module in modules:
                    wrapped = peft[lora_id][f"{PREFIX}{module}"]  # nn.Linear if not adapted
                    if lora_id is None and hasattr(wrapped, "lora_A"):
                        wrapped = wrapped.get_base_layer()
                    parts.append(wrapped(x[row]))
                torch.testing.assert_close(out[row], torch.cat(parts), msg=f"{modules} row {row}")
