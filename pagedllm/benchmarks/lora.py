"""`pagedllm bench lora`: what serving LoRA adapters costs, in one process.

Two engines of the same model: one without LoRA, one with enable_lora (max_loras 2, rank
--lora-rank), and two random PEFT adapters of the model's shapes on every projection
(written to a temporary folder: A and B drawn small, so outputs stay text-like). A batch of
--num-prompts greedy requests (ignore_eos, --output-len tokens) runs four ways: base rows on
the engine without LoRA, base rows on the LoRA engine, every row with one adapter, and half
the rows with each adapter. Each way runs once to warm up, then --num-iters rounds alternate
between them; a way's figure is its best round, as output tokens/s and its ratio to the
engine without LoRA. The LoRA engine's base rows must give that engine's tokens.
"""

import argparse
import dataclasses
import json
import os
import tempfile
import time

import torch
from safetensors.torch import save_file

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.llm import LLM
from pagedllm.lora.request import LoRARequest
from pagedllm.models.registry import ModelRegistry
from pagedllm.sampling_params import SamplingParams

PROMPT = "Write a long story about a lighthouse keeper who finds an old map.\n\nStory:"


def write_random_adapter(folder: str, llm: LLM, rank: int, seed: int) -> str:
    """A PEFT folder of random rank-`rank` LoRA weights on every projection the model
    serves adapters on; -> the folder."""
    model_config = llm.llm_engine.model_config
    model_cls = ModelRegistry.resolve_model_cls(model_config.architecture)
    shapes = model_cls.lora_target_shapes(model_config.hf_config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (in_features, out_features) in shapes.items():
        name = f"base_model.model.{module}"
        tensors[f"{name}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) * 0.02
        tensors[f"{name}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * 0.02
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    targets = sorted({module.rsplit(".", 1)[-1] for module in shapes})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return folder


def run_lora(args: argparse.Namespace) -> dict:
    engine_args = EngineArgs.from_cli_args(args)
    plain = LLM(**vars(dataclasses.replace(engine_args, enable_lora=False)))
    lora_args = dict(enable_lora=True, max_loras=2, max_lora_rank=args.lora_rank)
    lora = LLM(**vars(dataclasses.replace(engine_args, **lora_args)))
    with tempfile.TemporaryDirectory() as folder:
        adapters = [
            LoRARequest(
                f"bench{i}", i + 1, write_random_adapter(f"{folder}/{i}", lora, args.lora_rank, i)
            )
            for i in range(2)
        ]
        n = args.num_prompts
        ways = {
            "no LoRA engine, base rows": (plain, None),
            "LoRA engine, base rows": (lora, None),
            "LoRA engine, one adapter": (lora, adapters[0]),
            "LoRA engine, two adapters": (lora, [adapters[i % 2] for i in range(n)]),
        }
        results, tokens = _race(ways, _prompts(plain, n), args)
    plain.close()
    lora.close()
    base = results["no LoRA engine, base rows"]
    rows = {name: {"tok_s": rate, "vs_no_lora": rate / base} for name, rate in results.items()}
    same = tokens["no LoRA engine, base rows"] == tokens["LoRA engine, base rows"]
    config = {"num_prompts": n, "output_len": args.output_len, "lora_rank": args.lora_rank}
    return {
        "config": config | {"num_iters": args.num_iters},
        "ways": rows,
        "base_rows_same_tokens": same,
    }


def _prompts(llm: LLM, n: int) -> list[dict]:
    """n copies of the prompt's ids (a fixed 20-id prompt without a tokenizer)."""
    tokenizer = llm.llm_engine.tokenizer
    ids = tokenizer.encode(PROMPT) if tokenizer is not None else list(range(3, 23))
    return [{"prompt_token_ids": list(ids)} for _ in range(n)]


def _race(
    ways: dict[str, tuple[LLM, object]], prompts: list[dict], args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, list]]:
    """Best output tok/s of each way (rounds alternating between them; round 0 warms up),
    and each way's tokens."""
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    best: dict[str, float] = {}
    tokens: dict[str, list] = {}
    for round_index in range(args.num_iters + 1):
        for name, (llm, lora_request) in ways.items():
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
            elapsed = time.perf_counter() - start
            tokens[name] = [o.outputs[0].token_ids for o in outputs]
            if round_index > 0:
                best[name] = min(best.get(name, elapsed), elapsed)
    total = len(prompts) * args.output_len
    return {name: total / seconds for name, seconds in best.items()}, tokens


def format_lora(report: dict) -> str:
    config = report["config"]
    lines = [
        f"{config['num_prompts']} prompts x {config['output_len']} tokens greedy, adapters of "
        f"rank {config['lora_rank']} on every projection, best of {config['num_iters']}; "
        f"base rows give the same tokens on both engines: {report['base_rows_same_tokens']}",
        "| rows | output tok/s | vs no LoRA |",
        "|---|---|---|",
    ]
    for name, row in report["ways"].items():
        lines.append(f"| {name} | {row['tok_s']:.0f} | {row['vs_no_lora']:.2f}x |")
    return "\n".join(lines)
