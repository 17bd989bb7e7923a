"""pagedllm/entrypoints/openai/reasoning/tag_scanner.py. Reference: str.find on the whole
text: cutting at a tag gives the same pieces whether the text arrives whole or in pieces."""

import pytest

from pagedllm.entrypoints.openai.reasoning.tag_scanner import TagScanner, partial_tag_len


@pytest.mark.parametrize(
    ("text", "expected"),
    [("abc", 0), ("abc<", 1), ("abc</th", 4), ("</think", 7), ("</think>", 0), ("<<", 1), ("", 0)],
)
def test_partial_tag_len_is_the_longest_end_that_starts_the_tag(text: str, expected: int) -> None:
    assert partial_tag_len(text, "</think>") == expected


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_pieces_of_any_size_cut_where_find_cuts(size: int) -> None:
    text = "a <b</thin</think>c</think"
    scanner, released, found = TagScanner(), "", False
    for start in range(0, len(text), size):
        scanner.add(text[start : start + size])
        piece, found = scanner.take_until("</think>")
        released += piece
        if found:
            break
    assert (released, found) == (text[: text.find("</think>")], True)
    scanner.add(text[start + size :])
    assert scanner.take_all() == "c</think"
