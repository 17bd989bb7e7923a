"""The engine's LoRA adapters: each checked once, when added (`add_lora`) or when the first
request names it, against the model and max_lora_rank, so a bad adapter fails that call or
request alone and never a step.

An id names one adapter (lora_name, lora_path) for the engine's life, removed or not (a
request still running may hold it), and a name one id while it is known: a request that
mixes them is refused, so the ranks' slots (keyed by id and folder), the scheduler's count
of adapters and the prefix cache (keyed by folder) never mix two adapters.
"""

from pagedllm.config import EngineConfig, LoRAConfig
from pagedllm.lora.peft_adapter import read_peft_adapter
from pagedllm.lora.request import LoRARequest
from pagedllm.models.registry import ModelRegistry


def make_lora_registry(config: EngineConfig) -> "LoRARegistry":
    """The registry of an engine's config: no adapters accepted when LoRA is off."""
    if config.lora_config is None:
        return LoRARegistry(None, {})
    model_config = config.model_config
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    return LoRARegistry(config.lora_config, model_cls.lora_target_shapes(model_config.hf_config))


class LoRARegistry:
    def __init__(
        self, config: LoRAConfig | None, target_shapes: dict[str, tuple[int, int]]
    ) -> None:
        """`target_shapes`: the model class's lora_target_shapes (checkpoint module ->
        (in_features, out_features))."""
        self.config = config
        self.target_shapes = target_shapes
        self.adapters: dict[int, LoRARequest] = {}
        self.removed: dict[int, LoRARequest] = {}

    def check(self, request: object) -> LoRARequest | None:
        """The adapter a request names (None: the base model), read and checked the first
        time; ValueError / TypeError for one the engine cannot run."""
        if request is None:
            return None
        if not isinstance(request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if self.config is None:
            raise ValueError(
                f"lora_request {request.lora_name!r}: LoRA is off; start the engine with "
                "enable_lora=True (--enable-lora)"
            )
        known = self.adapters.get(request.lora_int_id) or self.removed.get(request.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
                raise ValueError(
                    f"lora_int_id {request.lora_int_id} is adapter {known.lora_name!r} "
                    f"({known.lora_path}); give {request.lora_name!r} another id"
                )
            if request.lora_int_id in self.adapters:
                return known
        for other in self.adapters.values():
            if other.lora_name == request.lora_name:
                raise ValueError(
                    f"LoRA adapter name {request.lora_name!r} is in use by lora_int_id "
                    f"{other.lora_int_id}; give another name"
                )
        read_peft_adapter(request.lora_path, self.target_shapes, self.config.max_lora_rank)
        self.removed.pop(request.lora_int_id, None)
        self.adapters[request.lora_int_id] = request
        return request

    def add(self, request: LoRARequest) -> bool:
        """vLLM's add_lora: True once the adapter is checked and known."""
        if not isinstance(request, LoRARequest):
            raise TypeError(f"add_lora takes a LoRARequest, got {type(request).__name__}")
        self.check(request)
        return True

    def remove(self, lora_int_id: int) -> bool:
        """vLLM's remove_lora: whether the adapter was known. Requests already running with
        it finish with it."""
        request = self.adapters.pop(lora_int_id, None)
        if request is None:
            return False
        self.removed[lora_int_id] = request
        return True

    def list(self) -> set[int]:
        return set(self.adapters)
