"""No silent drops: the request fields of OpenAI's and vLLM's schemas that pagedllm does not
implement, and what the server does with each.

A field that would change the answer (`best_of`, the old `functions` API, other
modalities, ...) gets a 400 naming it, unless its value asks for nothing (null, or the
field's default: `best_of: 1`, `modalities: ["text"]`, an empty list or object).
A field that changes no output (`metadata`, `store`, `service_tier`, `prediction`, ...)
is accepted and ignored, as vLLM does. A field in neither schema is logged and ignored,
as vLLM does: OpenAI's clients send newer fields before servers know them.
"""

from typing import Literal

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.logger import init_logger

logger = init_logger(__name__)

Endpoint = Literal["chat", "completion", "embedding", "classify", "pooling"]

_USE_STRUCTURED_OUTPUTS = "use structured_outputs (vLLM removed the guided_* fields)"

# field -> (its values that ask for nothing besides null, why / what to use instead)
_REFUSED: dict[str, tuple[tuple[object, ...], str]] = {
    "best_of": ((1,), "use n"),
    "prompt_embeds": ((), "prompts are text or token ids"),
    "kv_transfer_params": ((), "not implemented"),
    "vllm_xargs": ((), "not implemented"),
    "logits_processors": ((), "custom logits processors are set with LLM(...), not per request"),
    "mm_processor_kwargs": ((), "only text models are served"),
    "guided_json": ((), _USE_STRUCTURED_OUTPUTS),
    "guided_regex": ((), _USE_STRUCTURED_OUTPUTS),
    "guided_choice": ((), _USE_STRUCTURED_OUTPUTS),
    "guided_grammar": ((), _USE_STRUCTURED_OUTPUTS),
    "guided_decoding_backend": ((), _USE_STRUCTURED_OUTPUTS),
    "guided_whitespace_pattern": ((), _USE_STRUCTURED_OUTPUTS),
}
_REFUSED_CHAT: dict[str, tuple[tuple[object, ...], str]] = {
    "functions": ((), "use tools"),
    "function_call": ((), "use tool_choice"),
    "audio": ((), "only text is generated"),
    "modalities": ((["text"],), "only text is generated"),
    "web_search_options": ((), "web search is not implemented"),
    "verbosity": ((), "not implemented"),
    "echo": ((False,), "echo is a /v1/completions field"),
    "prompt_logprobs": ((), "not implemented for chat; use /v1/completions with echo"),
    "add_special_tokens": ((False,), "the chat template places the special tokens"),
    "documents": ((), "not implemented"),
    "chat_template": ((), "the server's template is set with --chat-template"),
}
_REFUSED_COMPLETION: dict[str, tuple[tuple[object, ...], str]] = {
    "suffix": ((), "not implemented"),
    "prompt_logprobs": ((), "use echo with logprobs"),
    "add_special_tokens": ((True,), "not implemented"),
}
# vLLM's output options, which the generating endpoints implement (SamplingFields'), and
# the pooling requests' own.
_REFUSED_POOLING: dict[str, tuple[tuple[object, ...], str]] = {
    "return_tokens_as_token_ids": ((False,), "a pooled prompt has no tokens to name"),
    "return_token_ids": ((False,), "a pooled prompt has no generated tokens"),
    "request_id": ((), "the server makes the response's id"),
    "cache_salt": ((), "pooling requests skip the prefix cache"),
    "priority": ((0,), "pooling requests run at priority 0"),
    "chat_template": ((), "the server's template is set with --chat-template"),
}
# The classifier's fields (classification, score and rerank) vLLM deprecated.
_REFUSED_CLASSIFY: dict[str, tuple[tuple[object, ...], str]] = {
    "softmax": ((), "vLLM's deprecated name; use use_activation"),
    "activation": ((), "vLLM's deprecated name; use use_activation"),
}
IGNORED_FIELDS = {
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "prediction",
}


def refused_fields(endpoint: Endpoint) -> dict[str, tuple[tuple[object, ...], str]]:
    """The fields an endpoint refuses, with their accepted no-op values and a reason."""
    own = {
        "chat": _REFUSED_CHAT,
        "completion": _REFUSED_COMPLETION,
        "embedding": _REFUSED_POOLING,
        "classify": _REFUSED_POOLING | _REFUSED_CLASSIFY,
        "pooling": _REFUSED_POOLING | _REFUSED_CLASSIFY,
    }
    return _REFUSED | own[endpoint]


def _asks_nothing(value: object, noop: tuple[object, ...]) -> bool:
    if value is None or value == [] or value == {}:
        return True
    return any(value == v and type(value) is type(v) for v in noop)


def check_unsupported_fields(extra: dict[str, object] | None, endpoint: Endpoint) -> None:
    """Raise a 400 naming the first refused field of a request's undeclared fields
    (`extra`); log the unknown ones."""
    refused = refused_fields(endpoint)
    unknown = []
    for name, value in (extra or {}).items():
        if name in refused:
            noop, reason = refused[name]
            if not _asks_nothing(value, noop):
                shown = repr(value)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise OpenAIError(
                    f"{name} is not supported by pagedllm ({reason}); got {shown}", param=name
                )
        elif name not in IGNORED_FIELDS:
            unknown.append(name)
    if unknown:
        logger.warning("the request's fields %r are unknown and ignored", sorted(unknown))
