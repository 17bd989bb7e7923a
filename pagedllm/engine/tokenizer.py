"""The tokenizer of a model folder or GGUF file, and the model's EOS ids."""

import os

import transformers
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from pagedllm.config import ModelConfig, needs_remote_code
from pagedllm.logger import init_logger

logger = init_logger(__name__)


def get_tokenizer(model_config: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of `model_config.tokenizer` (the model's folder or GGUF file unless
    another is named), loaded as its tokenizer_mode says."""
    path = model_config.tokenizer
    if model_config.tokenizer_mode == "slow":
        logger.warning(
            "tokenizer_mode 'slow': transformers %s has fast tokenizers only, so %s loads "
            "the same tokenizer as with 'auto'",
            transformers.__version__,
            path,
        )
    if path.endswith(".gguf"):
        from pagedllm.gguf.tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    try:
        return AutoTokenizer.from_pretrained(
            path,
            use_fast=model_config.tokenizer_mode != "slow",
            local_files_only=True,
            trust_remote_code=False,  # unset, transformers asks on stdin whether to run code
        )
    except (OSError, ValueError, TypeError) as e:
        raise needs_remote_code(path, e) or ValueError(
            f"cannot load a tokenizer from {path!r} ({e}); "
            "pass skip_tokenizer_init=True and give prompts as token ids"
        ) from e


def generation_config_dict(model_config: ModelConfig) -> dict:
    """generation_config.json of a folder (it may list several EOS ids), else {}. One that
    cannot be read is an error: running without its EOS ids would not stop where the
    model's authors meant it to."""
    path = os.path.join(model_config.model, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        return GenerationConfig.from_pretrained(model_config.model).to_dict()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e


def eos_token_ids(eos_token_id: int | None, generation_config: dict) -> list[int]:
    """Every id that ends an answer: the model's EOS and generation_config.json's."""
    extra = generation_config.get("eos_token_id")
    extra = [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
    ids = [] if eos_token_id is None else [eos_token_id]
    return ids + [i for i in extra if i not in ids]


def model_eos_token_id(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase | None
) -> int | None:
    """The tokenizer's EOS id, else the config's (the first of a list; None if empty)."""
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return tokenizer.eos_token_id
    eos = getattr(model_config.hf_config, "eos_token_id", None)
    if isinstance(eos, list):
        return eos[0] if eos else None
    return eos


def model_eos_token_ids(
    model_config: ModelConfig, tokenizer: PreTrainedTokenizerBase | None
) -> list[int]:
    """Every id that ends the model's answers (beam search's EOS): its EOS and
    generation_config.json's."""
    eos = model_eos_token_id(model_config, tokenizer)
    return eos_token_ids(eos, generation_config_dict(model_config))
