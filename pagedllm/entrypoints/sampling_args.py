"""Sampling flags shared by `generate` and `chat`."""

import argparse

from pagedllm.sampling_params import SamplingParams


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-tokens", type=int, default=max_tokens)
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0, help="0 = off")
    group.add_argument("--min-p", type=float, default=0.0)
    group.add_argument("--repetition-penalty", type=float, default=1.0)
    group.add_argument("--presence-penalty", type=float, default=0.0)
    group.add_argument("--frequency-penalty", type=float, default=0.0)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    group.add_argument("--ignore-eos", action="store_true")


def sampling_params_from_args(args: argparse.Namespace, **overrides: object) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        **overrides,
    )
