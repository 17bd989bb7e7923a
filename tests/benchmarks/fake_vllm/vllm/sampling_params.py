"""vllm.sampling_params of the fake vLLM: the keyword arguments the driver passes, no others."""

import enum
from dataclasses import dataclass


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
