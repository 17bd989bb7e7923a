"""TagScanner: the model's output, arriving piece by piece, cut at tags (`<think>`,
`</tool_call>`) that may themselves arrive split over pieces (`</`, `think`, `>`).

Text that could be the start of the awaited tag is held back until a later piece settles
it, so a parser fed the whole text at once and one fed it piece by piece cut it at the same
places."""


def partial_tag_len(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class TagScanner:
    def __init__(self) -> None:
        self.buffer = ""

    def add(self, text: str) -> None:
        self.buffer += text

    def take_until(self, tag: str) -> tuple[str, bool]:
        """(text before `tag`, True) and the tag consumed, if the buffer holds it; else
        (the text that cannot start it, False), keeping a possible start of it."""
        index = self.buffer.find(tag)
        if index >= 0:
            before, self.buffer = self.buffer[:index], self.buffer[index + len(tag) :]
            return before, True
        keep = partial_tag_len(self.buffer, tag)
        end = len(self.buffer) - keep
        released, self.buffer = self.buffer[:end], self.buffer[end:]
        return released, False

    def take_all(self) -> str:
        text, self.buffer = self.buffer, ""
        return text
