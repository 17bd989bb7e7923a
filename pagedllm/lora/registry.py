"""The engine's LoRA adapters: each read, checked against the model and max_lora_rank, and
loaded into host memory when added (`add_lora`) or when a request names it, so a bad or
unreadable adapter fails that call or request alone and never a step: a request holds its
adapter's weights (`LoadedAdapter`) until it ends, and no step reads a folder.

As vLLM's, an id names one adapter (lora_name, lora_path) while it is known, and a name
one id. What the scheduler, the prefix cache and the ranks' slots go by is the adapter's
content (`LoadedAdapter.key`, a digest of its weights as they run): requests of the same
weights share KV blocks whatever their names, and a folder whose files changed (removed,
then added again) is another adapter.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from pagedllm.config import EngineConfig, LoRAConfig
from pagedllm.lora.gguf_adapter import AdapterBase, is_gguf_adapter, read_gguf_adapter
from pagedllm.lora.peft_adapter import load_lora_weights, read_peft_adapter, weights_digest
from pagedllm.lora.request import LoRARequest
from pagedllm.models.registry import ModelRegistry
from pagedllm.models.weight_loading import WeightsMapper

Weights = dict[str, tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class LoadedAdapter:
    """An adapter as requests run it: the request that named it, `key` (weights_digest of
    its weights) and its weights (module -> (A, B * scaling), float32 on the host)."""

    request: LoRARequest
    key: str
    weights: Weights


def make_lora_registry(config: EngineConfig) -> "LoRARegistry":
    """The registry of an engine's config: no adapters accepted when LoRA is off."""
    if config.lora_config is None:
        return LoRARegistry(None, {})
    model_config = config.model_config
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    shapes = model_cls.lora_target_shapes(model_config.hf_config)
    base = AdapterBase(model_config.architecture, model_config.hf_config)
    return LoRARegistry(config.lora_config, shapes, model_cls.hf_to_pagedllm_mapper, base)


class LoRARegistry:
    def __init__(
        self,
        config: LoRAConfig | None,
        target_shapes: dict[str, tuple[int, int]],
        mapper: WeightsMapper | None = None,
        base: AdapterBase | None = None,
    ) -> None:
        """`target_shapes`: the model class's lora_target_shapes (checkpoint module ->
        (in_features, out_features)); `mapper`: its hf_to_pagedllm_mapper, which renames
        an adapter's modules; `base`: the served model, which a GGUF adapter must be of
        (None: GGUF adapters are refused)."""
        self.config = config
        self.target_shapes = target_shapes
        self.mapper = mapper
        self.base = base
        self.adapters: dict[int, LoRARequest] = {}
        # Weights of the max_cpu_loras adapters named last (requests hold their own).
        self.loaded: OrderedDict[int, LoadedAdapter] = OrderedDict()

    def check(self, request: object) -> LoadedAdapter | None:
        """The adapter a request names (None: the base model), loaded unless its weights
        are held; ValueError / TypeError for one the engine cannot run. The registry is
        unchanged until `keep` (a request refused for another reason registers nothing)."""
        if request is None:
            return None
        if not isinstance(request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if self.config is None:
            raise ValueError(
                f"lora_request {request.lora_name!r}: LoRA is off; start the engine with "
                "enable_lora=True (--enable-lora)"
            )
        self._check_identity(request)
        loaded = self.loaded.get(request.lora_int_id)
        return self._load(request) if loaded is None else loaded

    def adopt(self, loaded: LoadedAdapter) -> None:
        """Registers an adapter another registry loaded (a data-parallel replica's, from its
        parent's add_lora): the same weights, not read again."""
        if self.config is None:
            raise ValueError("LoRA is off; start the engine with enable_lora=True")
        self._check_identity(loaded.request)
        self.keep(loaded)

    def keep(self, loaded: LoadedAdapter | None) -> None:
        """Registers a checked adapter (its id and name taken) and holds its weights among
        the max_cpu_loras named last."""
        if loaded is None:
            return
        lora_int_id = loaded.request.lora_int_id
        self.adapters[lora_int_id] = loaded.request
        self.loaded[lora_int_id] = loaded
        self.loaded.move_to_end(lora_int_id)
        while len(self.loaded) > self.config.max_cpu_loras:
            self.loaded.popitem(last=False)

    def _check_identity(self, request: LoRARequest) -> None:
        known = self.adapters.get(request.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
                raise ValueError(
                    f"lora_int_id {request.lora_int_id} is adapter {known.lora_name!r} "
                    f"({known.lora_path}); give {request.lora_name!r} another id"
                )
            return
        for other in self.adapters.values():
            if other.lora_name == request.lora_name:
                raise ValueError(
                    f"LoRA adapter name {request.lora_name!r} is in use by lora_int_id "
                    f"{other.lora_int_id}; give another name"
                )

    def _load(self, request: LoRARequest) -> LoadedAdapter:
        weights = self._read(request.lora_path)
        return LoadedAdapter(request, weights_digest(weights), weights)

    def _read(self, path: str) -> Weights:
        """The weights of the PEFT folder or GGUF file at `path`, checked against the model."""
        max_rank = self.config.max_lora_rank
        if not is_gguf_adapter(path):
            adapter = read_peft_adapter(path, self.target_shapes, max_rank, self.mapper)
            return load_lora_weights(adapter)
        if self.base is None:
            raise ValueError(f"LoRA adapter {path}: this engine serves no GGUF adapters")
        return read_gguf_adapter(path, self.base, self.target_shapes, max_rank, self.mapper)

    def add(self, request: LoRARequest) -> bool:
        """vLLM's add_lora: True once the adapter is checked, loaded and known."""
        if not isinstance(request, LoRARequest):
            raise TypeError(f"add_lora takes a LoRARequest, got {type(request).__name__}")
        self.keep(self.check(request))
        return True

    def remove(self, lora_int_id: int) -> bool:
        """vLLM's remove_lora: whether the adapter was known. Requests already running with
        it finish with it; its id and name are free again."""
        self.loaded.pop(lora_int_id, None)
        return self.adapters.pop(lora_int_id, None) is not None

    def list(self) -> set[int]:
        return set(self.adapters)
