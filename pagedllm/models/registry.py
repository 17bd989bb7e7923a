"""Architecture string (config.json `architectures`) -> model class. A bare decoder
(`LlamaModel`, as embedding checkpoints name theirs) and a classifier
(`LlamaForSequenceClassification`, `LlamaForTokenClassification`) map to their
`*ForCausalLM` class, which a pooling model
runs without its LM head (model_loader/pooling_model.py); a classifier's score head runs
after the pooling (layers/classifier.py)."""

from torch import nn

from pagedllm.models.ernie4_5 import Ernie4_5ForCausalLM
from pagedllm.models.exaone4 import Exaone4ForCausalLM
from pagedllm.models.gemma import GemmaForCausalLM
from pagedllm.models.gemma2 import Gemma2ForCausalLM, Gemma3ForCausalLM
from pagedllm.models.glm4 import Glm4ForCausalLM
from pagedllm.models.granite import GraniteForCausalLM
from pagedllm.models.granitemoe import GraniteMoeForCausalLM
from pagedllm.models.internlm3 import InternLM3ForCausalLM
from pagedllm.models.llama import LlamaForCausalLM, MistralForCausalLM
from pagedllm.models.ministral import Ministral3ForCausalLM, MinistralForCausalLM
from pagedllm.models.mixtral import MixtralForCausalLM
from pagedllm.models.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from pagedllm.models.olmoe import OlmoeForCausalLM
from pagedllm.models.phi3 import Phi3ForCausalLM
from pagedllm.models.qwen2 import Qwen2ForCausalLM
from pagedllm.models.qwen2_moe import Qwen2MoeForCausalLM
from pagedllm.models.qwen3 import Qwen3ForCausalLM
from pagedllm.models.qwen3_moe import Qwen3MoeForCausalLM
from pagedllm.models.seed_oss import SeedOssForCausalLM
from pagedllm.models.smollm3 import SmolLM3ForCausalLM
from pagedllm.models.starcoder2 import Starcoder2ForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "GemmaForCausalLM": GemmaForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "GraniteMoeForCausalLM": GraniteMoeForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MinistralForCausalLM": MinistralForCausalLM,
    "Ministral3ForCausalLM": Ministral3ForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "SeedOssForCausalLM": SeedOssForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "Starcoder2ForCausalLM": Starcoder2ForCausalLM,
}
_NO_CLASSIFIER = frozenset(
    {
        "Ernie4_5ForCausalLM",
        "GraniteForCausalLM",
        "GraniteMoeForCausalLM",
        "Gemma3ForCausalLM",
        "OlmoeForCausalLM",
    }
)
"""Families transformers has no *ForSequenceClassification class of (asking transformers
would import its modeling code, seconds of start-up), or whose classifier is another
model's (Gemma3ForSequenceClassification is the multimodal Gemma 3's)."""
_NO_TOKEN_CLASSIFIER = _NO_CLASSIFIER | {"Olmo2ForCausalLM", "Olmo3ForCausalLM"}
"""Families transformers has no *ForTokenClassification class of."""
_MODELS |= {
    name.replace("ForCausalLM", suffix): cls
    for name, cls in _MODELS.items()
    for suffix, absent in (
        ("Model", frozenset()),
        ("ForSequenceClassification", _NO_CLASSIFIER),
        ("ForTokenClassification", _NO_TOKEN_CLASSIFIER),
    )
    if name not in absent
}
_MODELS["Gemma3TextModel"] = _MODELS.pop("Gemma3Model")
"""A family's bare decoder and its classifier (Gemma3Model is the multimodal Gemma 3; its
text decoder is Gemma3TextModel)."""
_MODELS["InternLM3ForCausalLM"] = InternLM3ForCausalLM
"""The class InternLM3's checkpoints name, their own code's: transformers runs them as
LlamaForCausalLM and has no InternLM3 bare decoder or classifier to name."""
_MODELS["Ernie4_5_ForCausalLM"] = Ernie4_5ForCausalLM
"""The class ERNIE 4.5's checkpoints released for Baidu's own code name (model_type
`ernie4_5`, the fields of transformers' Ernie4_5Config), as vLLM runs them."""


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
