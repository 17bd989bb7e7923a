"""Logprob tensors -> the per-token dicts users see (pagedllm/engine/logprobs.py). Reference:
log_softmax of the logits, each token's rank = the number of logprobs at least its own
(vLLM's), and, end to end, transformers' logits at each prompt position."""

import pytest
import torch

from pagedllm.engine.logprobs import append_prompt_logprobs, logprob_dict, logprobs_rows
from pagedllm.engine.request import Request
from pagedllm.outputs import Logprob
from pagedllm.sample.ops.logprobs import gather_logprobs
from pagedllm.sampling_params import RequestOutputKind, SamplingParams
from tests.engine.engine_helpers import LLAMA, add_prompts, make_engine, run_all

V = 12


class DigitTokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{t}>" for t in ids)


def test_logprob_dict_puts_the_chosen_token_first_with_its_rank() -> None:
    """The chosen token keeps its own rank even when it is also among the top-n."""
    result = logprob_dict(7, -2.5, 3, [4, 9, 7], [-0.5, -1.0, -2.5], None)
    assert list(result) == [7, 4, 9]
    assert result == {7: Logprob(-2.5, 3), 4: Logprob(-0.5, 1), 9: Logprob(-1.0, 2)}


def test_logprob_dict_decodes_unless_the_top_n_is_over_1024() -> None:
    tokenizer = DigitTokenizer()
    small = logprob_dict(5, -1.0, 2, [3], [-0.1], tokenizer)
    assert [lp.decoded_token for lp in small.values()] == ["<5>", "<3>"]
    top = list(range(1025))
    large = logprob_dict(5, -1.0, 2, top, [-1.0] * 1025, tokenizer)
    assert len(large) == 1025 and all(lp.decoded_token is None for lp in large.values())


def reference_dict(logprobs: torch.Tensor, token: int, n: int) -> dict[int, Logprob]:
    """The chosen token, then the n largest logprobs; its rank counts the values >= its own."""
    rank = int((logprobs >= logprobs[token]).sum())
    result = {token: Logprob(logprobs[token].item(), rank)}
    order = logprobs.argsort(descending=True)[:n].tolist()
    for r, t in enumerate(order, start=1):
        result.setdefault(t, Logprob(logprobs[t].item(), r))
    return result


def test_logprobs_rows_trim_each_row_to_its_n() -> None:
    """None: not asked; n: the chosen token and the top n; -1: the whole vocabulary."""
    logprobs = torch.randn(4, V).log_softmax(-1)
    tokens = torch.tensor([0, 3, 5, 11])
    tensors = gather_logprobs(logprobs, -1, tokens)
    rows = logprobs_rows(tensors, [None, 2, -1, 0], None)
    assert rows[0] is None
    for r, n in ((1, 2), (2, V), (3, 0)):
        expected = reference_dict(logprobs[r], tokens[r].item(), n)
        assert list(rows[r]) == list(expected)
        for t, lp in expected.items():
            assert rows[r][t].rank == lp.rank
            assert rows[r][t].logprob == pytest.approx(lp.logprob, abs=1e-6)
    assert len(rows[2]) == V
    assert logprobs_rows(None, [None, 1], None) == [None, None]


def prompt_request(prompt: list[int], prompt_logprobs: int) -> Request:
    return Request("r", None, prompt, SamplingParams(prompt_logprobs=prompt_logprobs))


def assert_prompt_logprobs(request: Request, logits: torch.Tensor, n: int) -> None:
    """Position p > 0 holds log_softmax(logits[p - 1]) at prompt[p] and its top n."""
    prompt = request.prompt_token_ids
    assert len(request.prompt_logprobs) == len(prompt) and request.prompt_logprobs[0] is None
    for p in range(1, len(prompt)):
        expected = reference_dict(logits[p - 1].log_softmax(-1), prompt[p], n)
        got = request.prompt_logprobs[p]
        assert list(got) == list(expected)
        assert [lp.rank for lp in got.values()] == [lp.rank for lp in expected.values()]
        values = [lp.logprob for lp in got.values()]
        assert values == pytest.approx([lp.logprob for lp in expected.values()], abs=1e-6)


@pytest.mark.parametrize("n", [0, 2, -1])
def test_prompt_logprobs_in_chunks_equal_log_softmax_at_each_position(n: int) -> None:
    """Chunks [0, 4), [4, 10): the last row predicts past the prompt and is dropped."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    logits = torch.randn(len(prompt), V)
    request = prompt_request(prompt, n)
    append_prompt_logprobs(request, logits[:4], 0, None)
    assert len(request.prompt_logprobs) == 5
    append_prompt_logprobs(request, logits[4:], 4, None)
    assert_prompt_logprobs(request, logits, V if n == -1 else n)


def test_overlapping_and_recomputed_chunks_add_no_position_twice() -> None:
    """A chunk overlapping filled positions adds only the new ones; a sequence recomputed
    after preemption (its prompt again from 0) adds nothing."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    logits = torch.randn(len(prompt), V)
    request = prompt_request(prompt, 1)
    append_prompt_logprobs(request, logits[:5], 0, None)
    append_prompt_logprobs(request, logits[2:7], 2, None)
    assert len(request.prompt_logprobs) == 8
    append_prompt_logprobs(request, logits[:3], 0, None)
    assert len(request.prompt_logprobs) == 8
    append_prompt_logprobs(request, logits[6:], 6, None)
    before = list(request.prompt_logprobs)
    append_prompt_logprobs(request, torch.randn(len(prompt), V), 0, None)
    assert request.prompt_logprobs == before
    assert_prompt_logprobs(request, logits, 1)


def test_one_token_prompt_has_only_none() -> None:
    request = prompt_request([3], 1)
    append_prompt_logprobs(request, torch.randn(1, V), 0, None)
    assert request.prompt_logprobs == [None]


def test_prompt_logprobs_match_transformers_under_chunking_and_preemption(
    tiny_model_path, hf_model, spread_prompts
) -> None:
    """Each prompt token's logprob and rank equal transformers' log_softmax of its logits,
    and streamed (delta) prompt logprobs add up to all of them, each sent once."""
    engine = make_engine(tiny_model_path(LLAMA), num_kv_blocks=17, max_num_batched_tokens=64)
    prompts = spread_prompts
    params = SamplingParams(max_tokens=32, ignore_eos=True, prompt_logprobs=1)
    ids = add_prompts(engine, prompts, params)
    delta = SamplingParams(max_tokens=4, prompt_logprobs=1, output_kind=RequestOutputKind.DELTA)
    engine.add_request("delta", {"prompt_token_ids": prompts[-1]}, delta)
    run = run_all(engine)
    assert engine.scheduler.num_preemptions > 0
    streamed = [lp for out in run.history["delta"] for lp in out.prompt_logprobs or []]
    assert len([o for o in run.history["delta"] if o.prompt_logprobs]) > 1
    results = [run.outputs[rid].prompt_logprobs for rid in ids] + [streamed]
    for logprobs, prompt in zip(results, prompts + prompts[-1:], strict=True):
        assert len(logprobs) == len(prompt) and logprobs[0] is None
        with torch.no_grad():
            ref = hf_model(LLAMA)(torch.tensor([prompt])).logits[0, :-1].log_softmax(-1)
        chosen = ref.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        ours = torch.tensor([lp[t].logprob for lp, t in zip(logprobs[1:], prompt[1:])])
        torch.testing.assert_close(ours, chosen, atol=1e-4, rtol=0)
        ranks = [lp[t].rank for lp, t in zip(logprobs[1:], prompt[1:])]
        assert ranks == ((ref > chosen[:, None]).sum(1) + 1).tolist()
