"""The step a GPU's memory is profiled with (executor/gpu_memory.py): the largest the
scheduler can make, as vLLM's profile run.

`max_num_batched_tokens` prompt tokens over min(max_num_seqs, tokens) sequences, each as
long as an even split allows (within max_model_len), on blocks of a cache of their own;
every sequence samples a token with the sampler's costliest features: temperature, top-k
and top-p (a sort of each row on a GPU), repetition, frequency and presence penalties, and
`max_logprobs` logprobs.
"""

from pagedllm.executor.batch import SeqChunk
from pagedllm.sample.metadata import SamplingRow
from pagedllm.sampling_params import SamplingParams


def profile_chunks(
    num_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int
) -> tuple[list[SeqChunk], int]:
    """-> (the step's chunks, the cache blocks they use), token id 0 throughout."""
    num_seqs = max(1, min(max_num_seqs, num_tokens))
    base, extra = divmod(num_tokens, num_seqs)
    chunks, next_block = [], 0
    for i in range(num_seqs):
        length = max(1, min(base + (i < extra), max_model_len))
        blocks = -(-length // block_size)
        chunks.append(SeqChunk([0] * length, 0, list(range(next_block, next_block + blocks))))
        next_block += blocks
    return chunks, next_block


def profile_rows(chunks: list[SeqChunk], max_logprobs: int, vocab_size: int) -> list[SamplingRow]:
    """A sampling row for each chunk, with every costly sampler feature on."""
    params = SamplingParams(
        temperature=1.0,
        top_k=min(50, vocab_size),
        top_p=0.9,
        repetition_penalty=1.1,
        frequency_penalty=0.1,
        presence_penalty=0.1,
        logprobs=max_logprobs or None,
        max_tokens=1,
    )
    return [SamplingRow(params, chunk.token_ids, []) for chunk in chunks]
