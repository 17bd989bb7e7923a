"""Helpers vLLM users import from `vllm.utils`."""

from pagedllm.utils.argparse_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
