"""rows_dense against its definition: the last dimension has stride 1 and a row t[i]'s
elements, in row-major order, lie at consecutive offsets (computed here from shape and
strides, element by element)."""

import itertools

import pytest
import torch

from pagedllm.tensor_layout import rows_dense, with_dense_rows


def _row_is_dense(t: torch.Tensor) -> bool:
    """The reference: unit last stride; row 0's element offsets are first, first + 1, ...
    in row-major order."""
    shape, stride = t.shape[1:], t.stride()[1:]
    indices = itertools.product(*map(range, shape))
    offsets = [sum(i * s for i, s in zip(index, stride)) for index in indices]
    consecutive = offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    return t.stride(-1) == 1 and consecutive


QKV = torch.arange(5 * 24.0).view(5, 24)  # [T, (H + 2 KV) * D] with H = 2, KV = 1, D = 6
VIEWS = {
    "contiguous": torch.zeros(5, 2, 6),
    "key of a fused qkv": QKV[:, 12:18].view(5, 1, 6),
    "query heads of a fused qkv": QKV[:, :12].view(5, 2, 6),
    "every other row": torch.zeros(10, 2, 6)[::2],
    "one head, any stride": torch.zeros(5, 1, 6).as_strided((5, 1, 6), (6, 99, 1)),
    "heads transposed": torch.zeros(5, 6, 2).transpose(1, 2),
    "half of each head": torch.zeros(5, 2, 6)[..., :3],
    "last stride 2": QKV[:, ::2],
    "one dimension": torch.zeros(7),
    "one dimension, strided": torch.zeros(14)[::2],
    "last dimension of size 1, stride 5": torch.zeros(4, 5)[:, 2:3],
}


@pytest.mark.parametrize("name", VIEWS)
def test_rows_dense_matches_row_offsets(name: str) -> None:
    t = VIEWS[name]
    assert rows_dense(t) == _row_is_dense(t)


def test_rows_dense_on_what_it_cannot_step() -> None:
    assert not rows_dense(torch.tensor(1.0))  # no rows
    assert rows_dense(VIEWS["key of a fused qkv"])  # in place, the rows 24 apart
    assert not rows_dense(VIEWS["heads transposed"])


def test_with_dense_rows_keeps_a_dense_view_and_copies_the_rest() -> None:
    key = VIEWS["key of a fused qkv"]
    assert with_dense_rows(key) is key
    halves = VIEWS["half of each head"]
    copied = with_dense_rows(halves)
    assert copied.is_contiguous() and torch.equal(copied, halves)
