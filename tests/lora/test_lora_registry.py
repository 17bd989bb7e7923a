"""pagedllm/lora/registry.py: which adapters the engine knows and whose weights it holds.
Reference: vLLM's rules (an id names one adapter, a name one id, both free again once
removed), the folder read once while its weights are held (counted by a spy on
read_peft_adapter), and the content key: the weights' digest, equal for equal weights."""

import shutil
from collections.abc import Callable

import pytest

from pagedllm.config import LoRAConfig
from pagedllm.lora import registry as registry_module
from pagedllm.lora.registry import LoadedAdapter, LoRARegistry
from pagedllm.lora.request import LoRARequest
from pagedllm.models.llama import LlamaForCausalLM
from tests.lora.peft_folders import save_adapter
from tests.models.tiny_models import tiny_configs

MODEL = "llama-gqa4"


@pytest.fixture(scope="module")
def folders(
    tiny_model_path: Callable[[str], str], tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    """Two rank-4 adapters of the tiny Llama."""
    paths = [str(tmp_path_factory.mktemp(f"adapter{i}")) for i in range(2)]
    for seed, path in enumerate(paths):
        save_adapter(tiny_model_path(MODEL), path, seed=seed, r=4)
    return paths


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders the registry reads from now on."""
    paths: list[str] = []
    original = registry_module.read_peft_adapter

    def spy(path: str, *args: object) -> object:
        paths.append(path)
        return original(path, *args)

    monkeypatch.setattr(registry_module, "read_peft_adapter", spy)
    return paths


def keep(registry: LoRARegistry, request: LoRARequest) -> LoadedAdapter:
    """As a request that passed every check: the adapter checked, then kept."""
    loaded = registry.check(request)
    registry.keep(loaded)
    return loaded


def test_check_alone_registers_nothing(folders: list[str]) -> None:
    """A request refused for another reason after its adapter was checked takes no id,
    no name and no place among the held weights."""
    registry = new_registry()
    loaded = registry.check(LoRARequest("a", 1, folders[0]))
    assert registry.list() == set() and not registry.loaded
    assert registry.check(LoRARequest("a", 2, folders[0])).key == loaded.key  # name still free
    registry.keep(loaded)
    assert registry.list() == {1} and registry.loaded[1] is loaded


def new_registry(max_lora_rank: int = 8, max_cpu_loras: int | None = None) -> LoRARegistry:
    shapes = LlamaForCausalLM.lora_target_shapes(tiny_configs()[MODEL])
    config = LoRAConfig(max_loras=2, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras)
    return LoRARegistry(config, shapes)


def test_lora_off_refuses_every_adapter_and_passes_the_base_model(folders: list[str]) -> None:
    registry = LoRARegistry(None, {})
    assert registry.check(None) is None
    with pytest.raises(ValueError, match="lora_request 'a': LoRA is off; start the engine with"):
        registry.check(LoRARequest("a", 1, folders[0]))
    with pytest.raises(ValueError, match="LoRA is off"):
        registry.add(LoRARequest("a", 1, folders[0]))


@pytest.mark.parametrize("request_", ["a", 1, {"lora_name": "a"}])
def test_anything_but_a_lora_request_is_a_type_error(request_: object) -> None:
    registry = new_registry()
    with pytest.raises(
        TypeError, match=f"lora_request must be a LoRARequest, got {type(request_).__name__}"
    ):
        registry.check(request_)
    with pytest.raises(TypeError, match="add_lora takes a LoRARequest"):
        registry.add(request_)


def test_a_known_adapter_is_not_read_again(folders: list[str], reads: list[str]) -> None:
    registry = new_registry()
    request = LoRARequest("a", 1, folders[0])
    assert registry.add(request) and reads == [folders[0]]
    loaded = registry.check(LoRARequest("a", 1, folders[0]))
    assert loaded.request is request and registry.check(request) is loaded
    assert registry.add(request) and reads == [folders[0]]


def test_weights_past_max_cpu_loras_are_read_again_when_named(
    folders: list[str], reads: list[str]
) -> None:
    """The registry holds the last max_cpu_loras adapters' weights; a request holding an
    older one keeps its own, and naming it again reads its folder again (same key)."""
    registry = new_registry(max_cpu_loras=2)
    first = keep(registry, LoRARequest("a", 1, folders[0]))
    keep(registry, LoRARequest("b", 2, folders[1]))
    keep(registry, LoRARequest("c", 3, folders[0]))  # the same weights as "a"
    assert list(registry.loaded) == [2, 3] and first.weights
    again = registry.check(LoRARequest("a", 1, folders[0]))
    assert again is not first and again.key == first.key
    assert reads == [folders[0], folders[1], folders[0], folders[0]]


def test_the_key_is_the_weights_digest(folders: list[str], tmp_path: object) -> None:
    """Equal weights, equal keys (another name and folder); other weights, another key,
    also when a folder's files are replaced and its adapter added again."""
    registry = new_registry()
    a = registry.check(LoRARequest("a", 1, folders[0]))
    copy = shutil.copytree(folders[0], f"{tmp_path}/copy")
    assert registry.check(LoRARequest("copy", 2, copy)).key == a.key
    assert registry.check(LoRARequest("b", 3, folders[1])).key != a.key
    registry.remove(2)
    shutil.rmtree(copy)
    shutil.copytree(folders[1], copy)
    assert registry.check(LoRARequest("copy", 2, copy)).key != a.key


def test_a_bad_adapter_is_refused_and_not_known(folders: list[str]) -> None:
    registry = new_registry(max_lora_rank=1)
    with pytest.raises(ValueError, match="over max_lora_rank 1"):
        registry.add(LoRARequest("a", 1, folders[0]))
    assert registry.list() == set()


@pytest.mark.parametrize("name, path", [("b", 0), ("a", 1), ("b", 1)])
def test_an_id_in_use_for_another_name_or_path_is_refused(
    folders: list[str], name: str, path: int
) -> None:
    registry = new_registry()
    registry.add(LoRARequest("a", 1, folders[0]))
    with pytest.raises(ValueError, match=f"lora_int_id 1 is adapter 'a' .*; give '{name}' another"):
        registry.check(LoRARequest(name, 1, folders[path]))


def test_a_name_in_use_by_another_id_is_refused(folders: list[str]) -> None:
    registry = new_registry()
    registry.add(LoRARequest("a", 1, folders[0]))
    for path in folders:
        with pytest.raises(ValueError, match="name 'a' is in use by lora_int_id 1; give another"):
            registry.add(LoRARequest("a", 2, path))
    assert registry.list() == {1}


def test_remove_then_add_the_same_adapter_again(folders: list[str], reads: list[str]) -> None:
    registry = new_registry()
    request = LoRARequest("a", 1, folders[0])
    registry.add(request)
    assert registry.remove(1) and not registry.remove(1) and registry.list() == set()
    assert registry.add(LoRARequest("a", 1, folders[0])) and registry.list() == {1}
    assert reads == [folders[0]] * 2  # checked again: the folder may have changed meanwhile


def test_a_removed_id_and_name_are_free_again(folders: list[str]) -> None:
    """As vLLM's: requests still running with the removed adapter hold its weights."""
    registry = new_registry()
    held = keep(registry, LoRARequest("a", 1, folders[0]))
    registry.remove(1)
    assert keep(registry, LoRARequest("b", 1, folders[1])).key != held.key
    assert registry.add(LoRARequest("a", 2, folders[1]))
    assert registry.list() == {1, 2} and held.weights


def test_list_holds_the_known_ids(folders: list[str]) -> None:
    registry = new_registry()
    assert registry.list() == set()
    registry.add(LoRARequest("a", 3, folders[0]))
    keep(registry, LoRARequest("b", 7, folders[1]))
    assert registry.list() == {3, 7}
    assert not registry.remove(5)
    registry.remove(3)
    assert registry.list() == {7}


def test_adopt_registers_anothers_loaded_adapter_without_reading_it(
    folders: list[str], reads: list[str]
) -> None:
    """A data-parallel replica adopts what its parent's add_lora loaded (the same object,
    no read), under the same identity rules; with LoRA off it adopts nothing."""
    parent, replica = new_registry(), new_registry()
    loaded = keep(parent, LoRARequest("a", 1, folders[0]))
    replica.adopt(loaded)
    assert reads == [folders[0]] and replica.check(LoRARequest("a", 1, folders[0])) is loaded
    other = parent.check(LoRARequest("b", 2, folders[1]))
    clash = LoadedAdapter(LoRARequest("b", 1, folders[1]), other.key, other.weights)
    with pytest.raises(ValueError, match="lora_int_id 1 is adapter 'a'"):
        replica.adopt(clash)
    with pytest.raises(ValueError, match="LoRA is off"):
        LoRARegistry(None, {}).adopt(loaded)
