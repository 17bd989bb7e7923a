"""Which tool-call format a chat template teaches its model, read from the template's text
(a GGUF file's template is its `tokenizer.chat_template` metadata): the name of the
`--tool-call-parser` that reads it, or "generic" for a template with no tool format, whose
model is told the tools and constrained to answer in the generic format (generic_tools.py).

A template is known by a marker its format leaves in it, as llama.cpp's server picks its
chat format: the first marker found names the format."""

# (a piece of template text, the format it marks), in the order they are tried: Mistral's
# control token first, since its templates may also quote other formats.
_MARKERS = (
    ("[TOOL_CALLS]", "mistral"),  # Mistral 7B v0.3, Mixtral, Nemo, Small
    ("<tool_call>", "hermes"),  # Hermes 2 Pro, Qwen2.5, Qwen3, QwQ
    ("<|python_tag|>", "llama3_json"),  # Llama 3.1
    ('"parameters": dictionary of argument name', "llama3_json"),  # Llama 3.2, 3.3
)
GENERIC = "generic"


def detect_tool_call_parser(chat_template: str | None) -> str:
    """The parser name for `chat_template`, the template requests with tools go through."""
    return next((name for marker, name in _MARKERS if marker in (chat_template or "")), GENERIC)
