"""OpenAI-style chat messages as chat templates read them (LLM.chat's and the server's
rule, as vLLM's): content given as a list of text parts is their texts joined by newlines,
a missing or null content is "", and a tool call's JSON `arguments` string becomes the
object it encodes (templates write `arguments | tojson` or read its fields)."""

import json
from collections.abc import Mapping
from typing import Any


def render_chat(
    tokenizer: Any, conversation: list[dict[str, Any]], **kwargs: Any
) -> tuple[str, list[int]]:
    """The conversation's prompt text through the tokenizer's chat template (`kwargs`:
    apply_chat_template's) and its token ids, without special tokens added again (the
    template places them, as transformers' tokenize=True). Whatever the template raises (a
    role or order it refuses) is a ValueError naming it."""
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - templates raise anything
        raise ValueError(f"cannot apply the chat template: {e}") from e
    return text, tokenizer.encode(text, add_special_tokens=False)


def template_message(message: object, index: int = 0) -> dict[str, Any]:
    """One message for the template; a ValueError names what is wrong with message `index`."""
    if not isinstance(message, Mapping):
        raise ValueError(f"messages[{index}] must be a dict, got {type(message).__name__}")
    if not isinstance(message.get("role"), str):
        raise ValueError(f"messages[{index}] needs a role (a str), got {message.get('role')!r}")
    result = dict(message)
    result["content"] = _text(message.get("content"), index)
    if message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
            raise ValueError(f"messages[{index}].tool_calls must be a list of dicts")
        result["tool_calls"] = [template_call(call) for call in calls]
    return result


def template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call whose `function.arguments` parse as JSON carries the parsed value, as vLLM
    gives it to templates; other arguments stay the text they are."""
    result = dict(call)
    function = call.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except json.JSONDecodeError:
            return result
        result["function"] = {**function, "arguments": arguments}
    return result


def _text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ValueError(
                    f"messages[{index}].content: only text parts are supported, got {kind!r}"
                )
            text = part.get("text")
            texts.append("" if text is None else str(text))
        return "\n".join(texts)
    raise ValueError(
        f"messages[{index}].content must be a str, a list of text parts or None, got "
        f"{type(content).__name__}"
    )
