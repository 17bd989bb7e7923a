"""vLLM's prompt types (`vllm.inputs`): what LLM.generate, encode and LLMEngine.add_request
take as one prompt. They are plain dicts, typed for readers and type checkers:

    llm.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]))
    llm.generate({"prompt": "Hello"})  # the same as TextPrompt(prompt="Hello")

Either may carry vLLM's `cache_salt`: a non-empty string mixed into the prefix-cache hash
of the prompt's first block, so that only requests with the same salt share cached blocks
(core/block_manager.py). pagedllm's models read text only: vLLM's multimodal keys
(multi_modal_data, mm_processor_kwargs) are refused, by name, rather than ignored."""

from typing import NotRequired, TypedDict


class TextPrompt(TypedDict):
    """A text, tokenized by the engine (with the tokenizer's special tokens, as vLLM)."""

    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """Token ids, sent to the model as they are."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    """The text of those ids, if the caller has it: echoed in RequestOutput.prompt, never
    tokenized."""
    cache_salt: NotRequired[str]


SingletonPrompt = str | TextPrompt | TokensPrompt
PromptType = SingletonPrompt
"""vLLM's name for one prompt (pagedllm runs no encoder-decoder models, whose prompts pair
two of these)."""

PROMPT_KEYS = tuple(dict.fromkeys([*TokensPrompt.__annotations__, *TextPrompt.__annotations__]))


def check_prompt_dict(prompt: dict) -> None:
    """A prompt dict holds only the keys of TextPrompt and TokensPrompt, its text a str and
    its cache_salt a non-empty str (vLLM's rule): any other key (an image in
    multi_modal_data, a misspelt key) would otherwise be dropped without a word."""
    unknown = [key for key in prompt if key not in PROMPT_KEYS]
    if unknown:
        raise ValueError(
            f"prompt dict keys {unknown} are not supported; a prompt holds "
            f"{', '.join(repr(k) for k in PROMPT_KEYS[:-1])} and {PROMPT_KEYS[-1]!r} "
            "(pagedllm.TextPrompt, pagedllm.TokensPrompt), and pagedllm's models read text only"
        )
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise TypeError(f"a prompt dict's 'prompt' must be a str, got {type(text).__name__}")
    salt = prompt.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError(
            f"Parameter 'cache_salt' must be a non-empty string if provided; got {salt!r}"
        )


def cache_salt_of(prompt: object) -> str | None:
    """A prompt dict's cache_salt (checked by check_prompt_dict); None for other prompts."""
    return prompt.get("cache_salt") if isinstance(prompt, dict) else None
