"""The rule OpenAI's and Anthropic's APIs hold a conversation's tool results to: a tool
message answers a call of the assistant message right before it (other tool messages may
come between), and its `tool_call_id`, when it has one, is that call's id. A result that
answers no call would reach the template as a result of nothing, or of another call; it is
a 400 that names the message and the ids it could have answered. A call left without a
result is accepted (vLLM's servers accept it; an agent may drop a call it will not run)."""

from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.protocol import ChatMessage


def check_tool_results(messages: list[ChatMessage], param: str = "messages") -> None:
    """OpenAIError naming `param` for the first tool message that answers no call (the
    message names the result's id: Responses and Anthropic's messages number theirs
    otherwise than the chat messages they become)."""
    calls: list[str] | None = None  # the ids of the calls the next tool message may answer
    for message in messages:
        if message.role == "assistant":
            calls = [call.id for call in message.tool_calls or []] or None
        elif message.role != "tool":
            calls = None
        elif calls is None:
            raise OpenAIError(
                f"the tool result {_shown(message)} does not follow an assistant message "
                "with tool calls: a tool result answers a call of the message before it",
                param=param,
            )
        elif message.tool_call_id is not None and message.tool_call_id not in calls:
            raise OpenAIError(
                f"the tool result {_shown(message)} answers no call of the assistant message "
                f"before it, whose calls are {', '.join(map(repr, calls))}",
                param=param,
            )


def _shown(message: ChatMessage) -> str:
    return "without an id" if message.tool_call_id is None else repr(message.tool_call_id)
