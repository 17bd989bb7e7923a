"""Iterate (name, tensor) over a HF folder's safetensors files, one tensor at a time."""

import json
import os
from collections.abc import Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(folder: str) -> list[str]:
    """The weight files of a folder: those named by the sharded index, else *.safetensors."""
    index_path = os.path.join(folder, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        missing = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
        if missing:
            raise ValueError(f"{index_path} names weight files that are missing: {missing}")
    else:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names:
        raise ValueError(f"no *.safetensors weight files in {folder!r}")
    return [os.path.join(folder, n) for n in names]


def iterate_safetensors_weights(
    folder: str, dtype: torch.dtype | None, keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors whose name `keep` rejects (another pipeline stage's) are never read; dtype
    None leaves each tensor as stored."""
    for path in safetensors_files(folder):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    if keep is None or keep(name):
                        tensor = f.get_tensor(name)
                        yield name, tensor if dtype is None else tensor.to(dtype)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"cannot read weight file {path}: {e}") from e
