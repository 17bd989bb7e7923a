"""A reasoning parser fed an answer in pieces of every size must give the same reasoning and
content as one fed it whole: what tests/entrypoints/openai/reasoning/ check each parser on."""

from pagedllm.entrypoints.openai.reasoning import ReasoningParser


def parse_in_pieces(parser: ReasoningParser, text: str, size: int) -> tuple[str, str]:
    deltas = [parser.feed(text[i : i + size]) for i in range(0, len(text), size)]
    deltas.append(parser.finish())
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


def check_streaming_matches_whole(
    make: type[ReasoningParser], prompt: str, text: str, expected: tuple[str | None, str | None]
) -> None:
    assert make(prompt).extract_reasoning_content(text) == expected
    for size in range(1, len(text) + 1):
        reasoning, content = parse_in_pieces(make(prompt), text, size)
        assert (reasoning or None, content or None) == expected, size


class TagTokenizer:
    """`<think>` is token 7 and `</think>` token 8, single tokens as in Qwen3 and R1."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [{"<think>": 7, "</think>": 8}[text]]
