"""The default model's tokenizer and a StructuredOutputManager on it, built once."""

import pytest
from transformers import PreTrainedTokenizerBase

from pagedllm.config import default_model_path
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from pagedllm.structured_output import StructuredOutputManager


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_gguf_tokenizer(default_model_path())


@pytest.fixture(scope="session")
def manager(tokenizer: PreTrainedTokenizerBase) -> StructuredOutputManager:
    return StructuredOutputManager(tokenizer, [tokenizer.eos_token_id])
