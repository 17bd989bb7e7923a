"""The layout a row-by-row kernel reads in place: each row one dense block, the rows at any
distance apart.

A kernel that walks a tensor [T, ...] one row x[t] at a time (a KV-cache write, an RMSNorm,
a rotary embedding) steps by the row stride alone, so it takes the query, key and value
split out of a fused qkv projection (column slices whose rows lie a whole qkv row apart) and
their per-head views without a copy. The C kernels (`_cpu_kernels`, whose `Tensor`
arguments declare this layout) and the Triton ones (`_triton_ops`) ask the same question
here, below both.
"""

import torch


def rows_dense(t: torch.Tensor) -> bool:
    """Whether a kernel reading t row by row takes it in place: its last dimension has
    stride 1 (a 1-D tensor is one row), and in a tensor of 2 or more dimensions each t[i] is
    one dense block (every dimension after the first has the stride of those after it
    together, except one of size 1, never stepped along). The first stride is free."""
    stride, shape = t.stride(), t.shape
    if not stride or stride[-1] != 1:
        return False
    size = shape[-1]
    for i in range(len(shape) - 2, 0, -1):
        if shape[i] != 1 and stride[i] != size:
            return False
        size *= shape[i]
    return True


def with_dense_rows(x: torch.Tensor) -> torch.Tensor:
    """x where its rows are dense (`rows_dense`, e.g. a column slice of a fused qkv
    projection), else a contiguous copy."""
    return x if rows_dense(x) else x.contiguous()
