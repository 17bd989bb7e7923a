"""The base of every per-token layer: calling it runs `forward` directly."""

from typing import Any

from torch import nn


class InferenceModule(nn.Module):
    """An nn.Module whose call skips nn.Module's hook dispatch.

    nn.Module.__call__ checks for forward/backward hooks on every call (~4 us); a decode
    step of a 30-layer model makes ~370 such calls, ~7% of an eager batch-1 step.
    pagedllm's layers are inference-only and register no hooks, so their call goes
    straight to forward; hooks registered on them do not run.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)
