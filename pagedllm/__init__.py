"""pagedllm: an LLM inference engine with a paged KV cache, in the mould of vLLM."""

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.inputs import PromptType, TextPrompt, TokensPrompt
from pagedllm.llm import LLM
from pagedllm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from pagedllm.pooler_config import PoolerConfig
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "BeamSearchParams",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "LLMEngine",
    "Logprob",
    "PoolerConfig",
    "PoolingParams",
    "PoolingRequestOutput",
    "PromptType",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "ScoringOutput",
    "ScoringRequestOutput",
    "TextPrompt",
    "TokensPrompt",
]
