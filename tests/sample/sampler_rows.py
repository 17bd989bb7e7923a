"""Sampler test helpers: one row's SamplingRow from SamplingParams' keywords (seeded rows
get their own generator), and a sampler call on a copy of the logits."""

import torch

from pagedllm.sample.metadata import SamplingMetadata, SamplingRow
from pagedllm.sample.sampler import Sampler, SamplerOutput
from pagedllm.sampling_params import SamplingParams

V = 24


def row(prompt: list[int], output: list[int], **kw) -> SamplingRow:
    params = SamplingParams(**kw)
    seed = params.seed
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return SamplingRow(params, prompt, output, generator)


def sample(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
    return sampler(logits.clone(), SamplingMetadata.build(rows, logits.shape[1], "cpu"))
