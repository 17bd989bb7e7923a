"""Real PEFT LoRA adapter folders on the tiny checkpoints (tests/models/tiny_models.py), as
`PeftModel.save_pretrained` writes them, and PEFT's own view of each adapted module: the
reference for what pagedllm/lora/peft_adapter.py reads."""

from dataclasses import dataclass

import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PREFIX = "base_model.model."


@dataclass
class PeftModule:
    """One adapted module as PEFT holds it: lora_A [r, in], lora_B [out, r], scaling."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


def peft_model(model_folder: str, seed: int = 0, **lora_kwargs: object) -> PeftModel:
    """transformers' float32 model of `model_folder` with a random (init_lora_weights=False)
    LoRA adapter; `lora_kwargs` go to LoraConfig (target_modules: ALL_TARGETS unless given)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32)
    lora_kwargs.setdefault("target_modules", ALL_TARGETS)
    torch.manual_seed(seed)
    return get_peft_model(base, LoraConfig(init_lora_weights=False, **lora_kwargs))


def save_adapter(
    model_folder: str, folder: str, seed: int = 0, safe_serialization: bool = True, **lora_kwargs
) -> PeftModel:
    """Writes the adapter of `peft_model(model_folder, seed, **lora_kwargs)` to `folder`."""
    model = peft_model(model_folder, seed, **lora_kwargs)
    model.save_pretrained(folder, safe_serialization=safe_serialization)
    return model


def peft_modules(model: PeftModel) -> dict[str, PeftModule]:
    """Checkpoint module name (model.layers.0.self_attn.q_proj ...) -> PEFT's adapted module."""
    modules = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            scaling = module.scaling["default"]
            modules[name.removeprefix(PREFIX)] = PeftModule(a.detach(), b.detach(), scaling)
    return modules
