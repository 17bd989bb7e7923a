"""vLLM's LoRARequest: which adapter a request runs with."""

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class LoRARequest:
    """A PEFT LoRA adapter folder (adapter_config.json and adapter_model.safetensors) or a
    llama.cpp GGUF LoRA adapter file (`.gguf`, see gguf_adapter.py) served
    under `lora_name`, known to the engine by `lora_int_id` (>= 1, unique per adapter).
    As vLLM's, two requests are the same adapter when their names are equal.
    `base_model_name`: the model the server lists as the adapter's parent (None: the
    served model)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if (
            isinstance(self.lora_int_id, bool)
            or not isinstance(self.lora_int_id, int)
            or self.lora_int_id < 1
        ):
            raise ValueError(f"lora_int_id must be an int >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(
                f"lora_path must name the adapter's folder or .gguf file, got {self.lora_path!r}"
            )

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
