"""The `pagedllm` command: generate | chat | serve | bench | inspect."""

import argparse
import sys

from pagedllm.benchmarks import cli as bench
from pagedllm.entrypoints import chat, generate, inspect
from pagedllm.entrypoints.openai import api_server
from pagedllm.utils import FlexibleArgumentParser


def build_parser() -> argparse.ArgumentParser:
    parser = FlexibleArgumentParser(
        prog="pagedllm",
        description="LLM inference with a paged KV cache. Without --model, commands use the "
        "embedded SmolLM2-135M-Instruct.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (generate, chat, api_server, bench, inspect):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"pagedllm {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
