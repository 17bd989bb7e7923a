"""Batch-invariant mode for the torch paths: `LLM(..., batch_invariant=True)`,
`--batch-invariant`, or PAGEDLLM_BATCH_INVARIANT=1 in the environment (vLLM's
VLLM_BATCH_INVARIANT).

pagedllm's CPU kernels compute every row in one order whatever the rows beside it
(docs/determinism.md), so where they run a request's answer never depends on its batch, its
prefill chunks or the prefix cache, switch or not. torch's own kernels (on GPUs, for float16,
without the extension) choose their algorithm, and so the order of a row's sums, from the
whole tensor's shape. In this mode `_torch_ops` runs every op that sums across a row (linear,
RMSNorm, attention) one row at a time, each call shaped the same whatever the batch: the same
answer, at a cost that grows with the rows of a step, since a prefill chunk's rows run one
by one.

The switch is process-wide, as vLLM's is: each worker sets it from its EngineConfig when it
builds the model (set_batch_invariant).
"""

from pagedllm.value_checks import env_flag

ENV = "PAGEDLLM_BATCH_INVARIANT"


def env_batch_invariant() -> bool:
    """PAGEDLLM_BATCH_INVARIANT as a bool (unset means False)."""
    return env_flag(ENV) or False


_enabled = False


def is_batch_invariant() -> bool:
    """Whether the torch ops run row by row (see the module docstring)."""
    return _enabled


def set_batch_invariant(enabled: bool) -> None:
    global _enabled
    _enabled = bool(enabled)
