"""pagedllm/lora/model_manager.py on the tiny models built as the engine builds them
(get_model). References: PEFT's adapted modules (the PeftModel that wrote each folder, on
the same checkpoint) for what a layer computes per row; the model class's
lora_target_shapes for which layers hold slots; the slots the engine's planner names."""

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch
from peft import PeftModel

from pagedllm.config import LoRAConfig, ModelConfig
from pagedllm.lora import layers as lora_layers
from pagedllm.lora.model_manager import LoRAModelManager
from pagedllm.lora.registry import LoadedAdapter, LoRARegistry
from pagedllm.lora.request import LoRARequest
from pagedllm.lora.slot_planner import LoRASlotPlanner
from pagedllm.model_loader.loader import get_model
from pagedllm.models.llama import LlamaForCausalLM
from pagedllm.models.registry import ModelRegistry
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


def target_shapes(path: str) -> dict[str, tuple[int, int]]:
    config = ModelConfig.create(path, dtype="float32")
    return ModelRegistry.resolve_model_cls(config.architecture).lora_target_shapes(config.hf_config)


@pytest.fixture
def loaded(adapters: list[tuple[LoRARequest, PeftModel]]) -> list[LoadedAdapter]:
    """The adapters as the engine's registry loads them."""
    shapes = LlamaForCausalLM.lora_target_shapes(tiny_configs()[MODEL])
    registry = LoRARegistry(LoRAConfig(max_loras=2, max_lora_rank=8, max_cpu_loras=3), shapes)
    return [registry.check(request) for request, _ in adapters]


def new_manager(
    tiny_model_path: Callable[[str], str], name: str = MODEL, **lora: int
) -> LoRAModelManager:
    model = get_model(ModelConfig.create(tiny_model_path(name), dtype="float32"))
    config = LoRAConfig(**{"max_loras": 2, "max_lora_rank": 8, **lora})
    return LoRAModelManager(model, config, torch.float32, torch.device("cpu"))


def activate(
    manager: LoRAModelManager,
    planner: LoRASlotPlanner,
    chunks: list[LoadedAdapter | None],
    lengths: list[int],
) -> AbstractContextManager:
    """A step of one chunk per entry (None: a base chunk), planned as the engine plans it."""
    slot_of, loads = planner.plan([a for a in chunks if a is not None])
    slots = [-1 if a is None else slot_of[a.key] for a in chunks]
    slot_keys = {slot: key for key, slot in slot_of.items()}
    return manager.activate(slot_keys, loads, slots, lengths)


@pytest.mark.parametrize("name", list(tiny_configs()))
def test_every_target_of_the_model_class_has_slots_of_its_shape(
    name: str, tiny_model_path: Callable[[str], str]
) -> None:
    """Each module of lora_target_shapes is in exactly one layer's slots, in its fused
    order (q, k, v; gate, up), the layer's input and output its (in, out) and the sum of
    its parts' outs; the MoE models' sparse layer 0 has no dense MLP to adapt, StarCoder 2's
    MLP is c_fc and c_proj."""
    manager = new_manager(tiny_model_path, name)
    modules = [m for _, subs in manager.layers for m in subs]
    shapes = target_shapes(tiny_model_path(name))
    assert sorted(modules) == sorted(shapes)
    qkv = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert qkv in [subs for _, subs in manager.layers]
    no_gate_proj = ("qwen3-moe", "starcoder2", "mixtral", "qwen2-moe", "olmoe", "granitemoe")
    assert ("model.layers.0.mlp.gate_proj" in modules) is (name not in no_gate_proj)
    assert ("model.layers.0.mlp.c_fc" in modules) is (name == "starcoder2")
    for slots, subs in manager.layers:
        assert slots.layer.lora is slots
        parts = [shapes[m] for m in subs]
        assert {in_features for in_features, _ in parts} == {slots.layer.input_size}
        assert sum(out for _, out in parts) == slots.layer.output_size


def test_a_slot_holds_what_the_engine_loaded_into_it(
    tiny_model_path: Callable[[str], str], loaded: list[LoadedAdapter]
) -> None:
    """Loads go into their slots before the forward; a step naming a slot that holds
    other weights (the engine and the rank disagree) fails instead of running them."""
    a, b, _ = loaded
    manager = new_manager(tiny_model_path)
    with manager.activate({0: a.key}, {0: a.weights}, [0], [1]):
        pass
    assert manager.slot_keys == [a.key, None]
    with manager.activate({0: a.key}, {}, [0], [1]):  # no weights travel again
        pass
    with pytest.raises(RuntimeError, match="LoRA slot 1 holds None"):
        with manager.activate({1: b.key}, {}, [1], [1]):
            pass


def test_activate_maps_each_chunk_s_rows_to_its_slot(
    tiny_model_path: Callable[[str], str], loaded: list[LoadedAdapter]
) -> None:
    a, b, _ = loaded
    manager, planner = new_manager(tiny_model_path), LoRASlotPlanner(2)
    with activate(manager, planner, [b], [1]):  # b in slot 0, a will take slot 1
        pass
    with activate(manager, planner, [a, None, b, a], [2, 1, 3, 1]):
        mapping = lora_layers.current_lora_mapping()
        assert mapping.slots == (0, 1)
        assert mapping.row_slots.dtype == torch.int32
        assert mapping.row_slots.tolist() == [1, 1, -1, 0, 0, 0, 1]
    assert lora_layers.current_lora_mapping() is None


def test_base_rows_only_map_to_no_slot(tiny_model_path: Callable[[str], str]) -> None:
    manager = new_manager(tiny_model_path)
    with manager.activate({}, {}, [-1, -1], [3, 2]):
        assert lora_layers.current_lora_mapping() is None


def test_each_layer_computes_peft_s_adapted_modules_per_row(
    tiny_model_path: Callable[[str], str],
    adapters: list[tuple[LoRARequest, PeftModel]],
    loaded: list[LoadedAdapter],
) -> None:
    """Rows of adapter 1 (attention only), of adapter 2 (everything) and of none, in one
    step: each fused layer's output is PEFT's modules' outputs concatenated."""
    (_, peft_a), (_, peft_b), _ = adapters
    a, b, _ = loaded
    manager = new_manager(tiny_model_path)
    peft = {
        None: dict(peft_a.named_modules()),
        1: dict(peft_a.named_modules()),
        2: dict(peft_b.named_modules()),
    }
    row_ids = [2, 2, None, 1, 1, 1]
    planner = LoRASlotPlanner(2)
    with activate(manager, planner, [b, None, a], [2, 1, 3]), torch.no_grad():
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


def test_slots_that_do_not_fit_in_memory_are_a_value_error(
    tiny_model_path: Callable[[str], str],
) -> None:
    with pytest.raises(ValueError, match="do not fit in memory: lower --max-loras"):
        new_manager(tiny_model_path, max_loras=10**12, max_lora_rank=512)
