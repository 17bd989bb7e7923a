"""`pagedllm generate [PROMPT]`: complete prompts (one argument, or one per line of stdin)."""

import argparse
import sys

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.chat_messages import render_chat
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.sampling_args import add_sampling_args, sampling_params_from_args
from pagedllm.llm import LLM
from pagedllm.logger import add_log_level_arg, set_log_level
from pagedllm.sampling_params import RequestOutputKind


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text for a prompt",
        description="Generate a completion. With --chat (default for instruct models with a "
        "chat template) the prompt is sent as a user message.",
    )
    parser.add_argument("prompt", nargs="?", default="-", help="the prompt, or - for stdin lines")
    parser.add_argument("--stream", action="store_true", help="print tokens as they come")
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap the prompt in the chat template (default: when the tokenizer has one)",
    )
    add_sampling_args(parser, max_tokens=256)
    EngineArgs.add_cli_args(parser)
    add_log_level_arg(parser, default="warning")
    parser.set_defaults(func=run)


def read_prompts(prompt: str) -> list[str]:
    if prompt != "-":
        return [prompt]
    prompts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        raise ValueError("no prompt given: pass PROMPT or lines on stdin")
    return prompts


def to_engine_prompt(engine: LLMEngine, prompt: str, use_chat: bool | None) -> str | dict:
    tokenizer = engine.tokenizer
    if use_chat is None:
        use_chat = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
    if not use_chat:
        return prompt
    if tokenizer is None:
        raise ValueError("--chat needs a tokenizer, but --skip-tokenizer-init is set")
    messages = [{"role": "user", "content": prompt}]
    _, ids = render_chat(tokenizer, messages, add_generation_prompt=True)
    return {"prompt": prompt, "prompt_token_ids": ids}


def stream(engine: LLMEngine, prompt: str | dict, args: argparse.Namespace) -> None:
    params = sampling_params_from_args(args, output_kind=RequestOutputKind.DELTA)
    engine.add_request("0", prompt, params)
    while engine.has_unfinished_requests():
        for output in engine.step():
            print(output.outputs[0].text, end="", flush=True)
    print()


def run(args: argparse.Namespace) -> None:
    prompts = read_prompts(args.prompt)
    set_log_level(args.log_level)
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    engine = llm.llm_engine
    engine_prompts = [to_engine_prompt(engine, p, args.chat) for p in prompts]
    if args.stream:
        for prompt in engine_prompts:
            stream(engine, prompt, args)
        return
    outputs = llm.generate(engine_prompts, sampling_params_from_args(args), use_tqdm=False)
    for output in outputs:
        print(output.outputs[0].text)
