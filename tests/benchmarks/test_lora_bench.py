"""pagedllm/benchmarks/lora.py: `pagedllm bench lora` on a tiny random model. Reference:
LoRA's contract (base rows on the LoRA engine give the plain engine's tokens), the random
adapters read as PEFT folders would be, and the report's own arithmetic."""

import json
from collections.abc import Callable

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.benchmarks.lora import write_random_adapter
from pagedllm.lora.peft_adapter import read_peft_adapter
from pagedllm.lora.request import LoRARequest
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL


def test_bench_lora_reports_each_way_against_no_lora(
    run_bench: Callable[[list[str]], str], tiny_model_path: Callable[[str], str], tmp_path: object
) -> None:
    json_path = f"{tmp_path}/lora.json"
    argv = ["lora", "--model", tiny_model_path(TINY_MODEL), *TINY_ENGINE_FLAGS]
    argv += ["--num-prompts", "3", "--output-len", "6", "--lora-rank", "8"]
    argv += ["--num-iters", "1", "--json", json_path]
    out = run_bench(argv)
    report = json.load(open(json_path))
    assert report["config"] == {"num_prompts": 3, "output_len": 6, "lora_rank": 8, "num_iters": 1}
    assert report["base_rows_same_tokens"] is True
    ways = report["ways"]
    assert list(ways) == [
        "no LoRA engine, base rows",
        "LoRA engine, base rows",
        "LoRA engine, one adapter",
        "LoRA engine, two adapters",
    ]
    base = ways["no LoRA engine, base rows"]["tok_s"]
    for row in ways.values():
        assert row["vs_no_lora"] == pytest.approx(row["tok_s"] / base)
    assert "| LoRA engine, two adapters |" in out and "vs no LoRA" in out


def test_random_adapters_cover_every_target_and_change_the_output(
    tiny_model_path, tmp_path
) -> None:
    """The bench's adapter passes the engine's checks on every projection of the model at
    its rank, and runs: its tokens' logprobs differ from the base model's."""
    llm = LLM(
        tiny_model_path(TINY_MODEL),
        skip_tokenizer_init=True,
        num_kv_blocks=64,
        enable_lora=True,
        max_lora_rank=8,
    )
    folder = write_random_adapter(str(tmp_path / "a"), llm, 8, seed=0)
    shapes = llm.llm_engine.lora_registry.target_shapes
    adapter = read_peft_adapter(folder, shapes, 8)
    assert set(adapter.ranks) == set(shapes) and set(adapter.ranks.values()) == {8}
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    (base,) = llm.generate(prompt, params, use_tqdm=False)
    (tuned,) = llm.generate(
        prompt, params, use_tqdm=False, lora_request=LoRARequest("a", 1, folder)
    )
    assert base.outputs[0].logprobs != tuned.outputs[0].logprobs
