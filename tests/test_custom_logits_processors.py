"""Custom logits processors end to end through LLM on a tiny random checkpoint (vLLM v1's
interface). References: transformers' greedy `generate(suppress_tokens=...)`, the loader's
contract (a ValueError naming a bad processor) and the processor's own validate_params."""

import pytest
import torch

from pagedllm import LLM
from pagedllm.sample.logits_processors import LogitsProcessor
from pagedllm.sampling_params import SamplingParams
from tests.sampling_helpers import (
    LLAMA,
    MAX_TOKENS,
    TINY_KWARGS,
    as_prompts,
    completions,
    greedy,
    hf_generate_greedy,
    tiny_llm,
)

__all__ = ["tiny_llm"]  # a fixture this module's tests use


class BanToken(LogitsProcessor):
    """Bans extra_args["ban"] for the requests that set it (docs/sampling.md's example)."""

    def __init__(self, vocab_size, device, is_pin_memory=False):
        super().__init__(vocab_size, device, is_pin_memory)
        self.bans: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index, params, _prompt, _output in batch_update.added:
            ban = (params.extra_args or {}).get("ban")
            if ban is None:
                self.bans.pop(index, None)
            else:
                self.bans[index] = ban
        for index in batch_update.removed:
            self.bans.pop(index, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.bans.items():
            logits[row, token] = float("-inf")
        return logits


class StrictBanToken(BanToken):
    """BanToken that rejects a request whose extra_args["ban"] is not an int."""

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        ban = (params.extra_args or {}).get("ban")
        if ban is not None and not isinstance(ban, int):
            raise ValueError(f"extra_args['ban'] must be a token id (int), got {ban!r}")


class NotAProcessor:
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@pytest.mark.parametrize(
    "spec, async_scheduling",
    [(BanToken, False), (f"{__name__}:BanToken", False), (BanToken, True)],
    ids=["class", "string", "async"],
)
def test_ban_token_processor_matches_transformers_suppress_tokens(
    spec, async_scheduling, tiny_llm, hf_model, hf_greedy, spread_prompts
) -> None:
    """Reference: transformers' greedy `generate(suppress_tokens=[t])` for the request that
    sets extra_args, plain greedy `generate` for the two that do not (same batch); under
    async scheduling too (each step's sampling after the step before is processed)."""
    prompt = spread_prompts[3]
    (plain,) = hf_greedy(LLAMA, [prompt], MAX_TOKENS)
    banned = plain.token_ids[0]
    suppressed = hf_generate_greedy(hf_model(LLAMA), prompt, MAX_TOKENS, suppress_tokens=[banned])
    assert banned not in suppressed
    llm = tiny_llm(LLAMA, logits_processors=(spec,), async_scheduling=async_scheduling)
    params = [greedy(ignore_eos=True), greedy(ignore_eos=True, extra_args={"ban": banned})]
    outputs = completions(llm, as_prompts([prompt] * 3), params + params[:1])
    assert [c.token_ids for c in outputs] == [plain.token_ids, suppressed, plain.token_ids]


@pytest.mark.parametrize(
    "spec, message",
    [
        (f"{__name__}:MissingProcessor", r"cannot load logits processor '.*:MissingProcessor'"),
        ("no_such_module_for_pagedllm:Ban", "cannot load logits processor"),
        ("NoColonOrDot", "must be 'module:Class' or a class"),
        (NotAProcessor, "must be a subclass of LogitsProcessor"),
    ],
)
def test_broken_processor_raises_at_construction(spec, message, tiny_model_path) -> None:
    """Reference: the loader's contract, a ValueError naming the bad processor."""
    with pytest.raises(ValueError, match=message):
        LLM(tiny_model_path(LLAMA), logits_processors=[spec], num_kv_blocks=16, **TINY_KWARGS)


def test_validate_params_rejects_request_at_add(tiny_llm, hf_greedy, spread_prompts) -> None:
    """Reference: StrictBanToken.validate_params; the engine stays idle and keeps serving."""
    llm = tiny_llm(LLAMA, logits_processors=(StrictBanToken,))
    engine, prompt = llm.llm_engine, spread_prompts[2]
    bad = greedy(extra_args={"ban": "x"})
    message = r"extra_args\['ban'\] must be a token id \(int\), got 'x'"
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", {"prompt_token_ids": prompt}, bad)
    with pytest.raises(ValueError, match=message):
        llm.generate(as_prompts([prompt] * 2), [greedy(), bad], use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    (output,) = completions(llm, as_prompts([prompt]), [greedy(ignore_eos=True)])
    assert output.token_ids == hf_greedy(LLAMA, [prompt], MAX_TOKENS)[0].token_ids
