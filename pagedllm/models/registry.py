"""Architecture string (config.json `architectures`) -> model class. A bare decoder
(`LlamaModel`, as embedding checkpoints name theirs) and a classifier
(`LlamaForSequenceClassification`) map to their `*ForCausalLM` class, which a pooling model
runs without its LM head (model_loader/pooling_model.py); a classifier's score head runs
after the pooling (layers/classifier.py)."""

import transformers
from torch import nn

from pagedllm.models.granite import GraniteForCausalLM
from pagedllm.models.llama import LlamaForCausalLM, MistralForCausalLM
from pagedllm.models.olmo2 import Olmo2ForCausalLM
from pagedllm.models.qwen2 import Qwen2ForCausalLM
from pagedllm.models.qwen3 import Qwen3ForCausalLM
from pagedllm.models.qwen3_moe import Qwen3MoeForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "GraniteForCausalLM": GraniteForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}
_MODELS |= {
    variant: cls
    for name, cls in _MODELS.items()
    for suffix in ("Model", "ForSequenceClassification")
    if hasattr(transformers, variant := name.replace("ForCausalLM", suffix))
}
"""A family's bare decoder and classifier, where transformers has them (Granite has no
classifier)."""


class ModelRegistry:
    @staticmethod
    def get_supported_archs() -> list[str]:
        return sorted(_MODELS)

    @staticmethod
    def resolve_model_cls(architecture: str) -> type[nn.Module]:
        if architecture not in _MODELS:
            raise ValueError(
                f"architecture {architecture!r} is not supported; supported architectures: "
                f"{', '.join(ModelRegistry.get_supported_archs())}"
            )
        return _MODELS[architecture]
