"""What an engine leaves for Python's cyclic collector once it is dropped."""

import gc
import weakref
from collections.abc import Callable

import torch


def left_for_the_cyclic_collector(build_and_use: Callable[[], object]) -> list[str]:
    """Checks that the object `build_and_use()` returns (an LLM, an engine) is freed as soon
    as it is dropped; -> the types of the pagedllm objects and tensors it left in reference
    cycles, which only the cyclic collector frees, on a full pass, at a time of its
    choosing (until then they hold their memory: a model's weights, its KV cache)."""
    gc.collect()
    gc.disable()
    try:
        obj = weakref.ref(build_and_use())
        assert obj() is None, "something outside it still holds it"
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = [
            f"{type(o).__module__}.{type(o).__qualname__}"
            for o in gc.garbage
            if type(o).__module__.startswith("pagedllm") or isinstance(o, torch.Tensor)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return kinds
