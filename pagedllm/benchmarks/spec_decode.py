"""`pagedllm bench spec-decode`: n-gram speculative decoding against none, in one process.

Two engines of the same model, one with the speculative config (--speculative-config, by
default the n-gram method with 4 draft tokens from 3- and 4-gram matches), greedy with
ignore_eos, on three fixed prompts: one that holds a text three times and the start of a
fourth (its continuation copies it), one that asks for the text repeated, one that asks
for a story (free text). Each engine runs each prompt once to warm up (captures, prefix
cache), then --num-iters rounds alternate between the engines; a prompt's figure is its
best round. Without a tokenizer the prompts are seeded random ids (the copy prompt a block
of them three times), which measures the cost of drafting more than its gain.
"""

import argparse
import dataclasses
import random
import time

from pagedllm.config import SpeculativeConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.llm import LLM
from pagedllm.sampling_params import SamplingParams

DEFAULT_SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 3,
    "prompt_lookup_max": 4,
}
_TEXT = (
    "In the early morning the fishermen of the small harbour town prepared their boats, "
    "checked the nets, and talked about the weather, the price of fuel and the festival that "
    "would start on Saturday. Children ran along the quay while the baker opened his shop "
    "and the smell of fresh bread filled the street. "
)
PROMPTS = {
    "copy": "Text: " + _TEXT * 3 + "\nThe same text again: " + _TEXT[:60],
    "quote": "Repeat the following text exactly.\n\nText: " + _TEXT + "\n\nRepeated text:",
    "story": "Write a long story about a lighthouse keeper who finds an old map.\n\nStory:",
}


def prompt_ids(llm: LLM, seed: int) -> dict[str, list[int]]:
    """Each prompt's token ids; seeded random ids without a tokenizer."""
    tokenizer = llm.llm_engine.tokenizer
    if tokenizer is not None:
        return {name: tokenizer.encode(text) for name, text in PROMPTS.items()}
    rng = random.Random(seed)
    vocab_size = llm.llm_engine.model_config.vocab_size

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(n)]

    block = ids(40)
    return {"copy": block * 3 + block[:10], "quote": ids(50), "story": ids(20)}


def run_spec_decode(args: argparse.Namespace) -> dict:
    engine_args = EngineArgs.from_cli_args(args)
    spec = SpeculativeConfig.parse(engine_args.speculative_config or DEFAULT_SPECULATIVE_CONFIG)
    llms = {
        "off": LLM(**vars(dataclasses.replace(engine_args, speculative_config=None))),
        "ngram": LLM(**vars(dataclasses.replace(engine_args, speculative_config=spec))),
    }
    prompts = prompt_ids(llms["off"], args.seed)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    results = {}
    for name, ids in prompts.items():
        results[name] = _race(llms, ids, params, args.num_iters)
    for llm in llms.values():
        llm.close()
    spec_keys = {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}
    config = {"speculative_config": spec_keys, "output_len": args.output_len}
    return {"config": config | {"num_iters": args.num_iters}, "prompts": results}


def _race(llms: dict[str, LLM], ids: list[int], params: SamplingParams, num_iters: int) -> dict:
    """Best tok/s of each engine on one prompt (rounds alternating between them), the
    speculating engine's accepted / drafted tokens in one round, and whether both engines
    gave the same tokens."""
    prompt = {"prompt_token_ids": ids}
    best, tokens, counts = {}, {}, None
    for round_index in range(num_iters + 1):  # round 0 warms up
        for name, llm in llms.items():
            before = llm.llm_engine.get_stats().spec_decoding
            start = time.perf_counter()
            (output,) = llm.generate([prompt], params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            after = llm.llm_engine.get_stats().spec_decoding
            tokens[name] = output.outputs[0].token_ids
            if round_index > 0:
                best[name] = min(best.get(name, elapsed), elapsed)
            if after is not None:
                counts = (
                    after.num_accepted_tokens - before.num_accepted_tokens,
                    after.num_draft_tokens - before.num_draft_tokens,
                )
    rates = {name: params.max_tokens / seconds for name, seconds in best.items()}
    return {
        "prompt_tokens": len(ids),
        "off_tok_s": rates["off"],
        "ngram_tok_s": rates["ngram"],
        "speedup": rates["ngram"] / rates["off"],
        "accepted_tokens": counts[0],
        "draft_tokens": counts[1],
        "same_tokens": tokens["off"] == tokens["ngram"],
    }


def format_spec_decode(report: dict) -> str:
    config = report["config"]
    lines = [
        f"speculative_config {config['speculative_config']}, {config['output_len']} tokens "
        f"greedy, best of {config['num_iters']}",
        "| prompt | off tok/s | ngram tok/s | ngram / off | accepted / drafted | same tokens |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in report["prompts"].items():
        lines.append(
            f"| {name} | {r['off_tok_s']:.0f} | {r['ngram_tok_s']:.0f} | {r['speedup']:.2f}x | "
            f"{r['accepted_tokens']} / {r['draft_tokens']} | {r['same_tokens']} |"
        )
    return "\n".join(lines)
