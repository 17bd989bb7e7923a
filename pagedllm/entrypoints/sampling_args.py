"""Sampling flags shared by `generate` and `chat`."""

import argparse

from pagedllm.sampling_params import REQUEST_FIELDS, SamplingParams


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
    """SamplingParams from the flags above: each is named after its field."""
    fields = {name: getattr(args, name) for name in REQUEST_FIELDS if hasattr(args, name)}
    return SamplingParams(max_tokens=args.max_tokens, **fields, **overrides)
