"""`pagedllm bench perplexity`: how well the model predicts a fixed text, through the public API.

Perplexity = exp(mean negative log-likelihood) of each token given the tokens before it. The
text is cut into consecutive windows of `window` tokens (the last may be shorter), each one a
request with `prompt_logprobs=0`: the engine returns the logprob of every prompt token after
the first from the raw logits. A window's first token has no context and is not scored.
The same text and window give the same tokens scored, so runs of one model at different
precisions (e.g. `--quantization none` against the GGUF as stored) compare directly.
"""

import argparse
import math
import os
import time

import torch

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.llm import LLM
from pagedllm.sampling_params import SamplingParams

# The fixture's place in a source checkout (tests/fixtures/README.md gives its source).
DEFAULT_TEXT = os.path.normpath(
    os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "perplexity.txt")
)


def text_windows(token_ids: list[int], window: int) -> list[list[int]]:
    """Consecutive windows of `window` tokens; a last window of one token (nothing to score)
    is dropped."""
    if window < 2:
        raise ValueError(f"window {window} must be >= 2 (a window's first token is not scored)")
    if len(token_ids) < 2:
        raise ValueError(f"the text has {len(token_ids)} tokens; perplexity needs at least 2")
    windows = [token_ids[i : i + window] for i in range(0, len(token_ids), window)]
    return [w for w in windows if len(w) > 1]


def token_nlls(llm: LLM, token_ids: list[int], window: int) -> list[float]:
    """-log p(token | the tokens before it in its window), for every token but each window's
    first, in text order."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    prompts = [{"prompt_token_ids": w} for w in text_windows(token_ids, window)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    nlls = []
    for output in outputs:
        tokens, logprobs = output.prompt_token_ids[1:], output.prompt_logprobs[1:]
        nlls += [-position[token].logprob for token, position in zip(tokens, logprobs)]
    return nlls


def perplexity(llm: LLM, token_ids: list[int], window: int) -> float:
    """exp(mean negative log-likelihood) over the scored tokens (see token_nlls)."""
    nlls = token_nlls(llm, token_ids, window)
    return math.exp(sum(nlls) / len(nlls))


def run_perplexity(args: argparse.Namespace) -> dict:
    with open(_text_path(args.text), encoding="utf-8") as f:
        text = f.read()
    start = time.perf_counter()
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    startup = time.perf_counter() - start
    tokenizer = llm.llm_engine.tokenizer
    if tokenizer is None:
        raise ValueError("perplexity tokenizes its text: drop --skip-tokenizer-init")
    token_ids = tokenizer.encode(text)
    start = time.perf_counter()
    nlls = token_nlls(llm, token_ids, args.window)
    elapsed = time.perf_counter() - start
    model_config = llm.llm_engine.model_config
    llm.close()
    return {
        "benchmark": "perplexity",
        "config": {
            "model": model_config.model,
            "dtype": str(model_config.dtype).removeprefix("torch."),
            "quantization": model_config.quantization or "none",
            "threads": torch.get_num_threads(),
            "text": os.path.abspath(_text_path(args.text)),
            "window": args.window,
        },
        "perplexity": math.exp(sum(nlls) / len(nlls)),
        "text_tokens": len(token_ids),
        "scored_tokens": len(nlls),
        "windows": len(text_windows(token_ids, args.window)),
        "elapsed_s": elapsed,
        "startup_s": startup,
    }


def _text_path(text: str | None) -> str:
    path = text or DEFAULT_TEXT
    if not os.path.isfile(path):
        hint = " (the default fixture ships with the source checkout)" if text is None else ""
        raise ValueError(f"--text {path!r} is not a file{hint}")
    return path


def format_perplexity(report: dict) -> str:
    c = report["config"]
    return "\n".join(
        [
            f"model {c['model']} ({c['dtype']}, quantization {c['quantization']}, "
            f"{c['threads']} threads)",
            f"text {c['text']}: {report['text_tokens']} tokens in {report['windows']} windows "
            f"of up to {c['window']}, {report['scored_tokens']} scored",
            f"perplexity {report['perplexity']:.4f}",
            f"elapsed {report['elapsed_s']:.2f} s "
            f"({report['text_tokens'] / report['elapsed_s']:.1f} tok/s); "
            f"start-up {report['startup_s']:.2f} s",
        ]
    )
