"""vLLM's --enable-log-requests: one INFO line per request the server submits (its id,
prompt, prompt token ids and parameters), the prompt and ids cut to --max-log-len. Off by
default, as in vLLM: prompts can hold what operators should not keep in logs."""

from pagedllm.logger import init_logger

logger = init_logger("pagedllm.requests")


class RequestLogger:
    def __init__(self, max_log_len: int | None = None) -> None:
        """`max_log_len`: at most this many characters of the prompt and this many of its
        token ids (None: all of them)."""
        self.max_log_len = max_log_len

    def log(self, request_id: str, prompt: dict, params: object) -> None:
        text = prompt.get("prompt")
        ids = prompt.get("prompt_token_ids")
        if self.max_log_len is not None:
            text = None if text is None else text[: self.max_log_len]
            ids = None if ids is None else ids[: self.max_log_len]
        logger.info(
            "Received request %s: prompt: %r, params: %r, prompt_token_ids: %s",
            request_id,
            text,
            params,
            ids,
        )
