"""`pagedllm chat`: an interactive conversation that streams the replies; /exit leaves."""

import argparse

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.chat_messages import render_chat
from pagedllm.entrypoints.sampling_args import add_sampling_args, sampling_params_from_args
from pagedllm.llm import LLM
from pagedllm.logger import add_log_level_arg, set_log_level
from pagedllm.sampling_params import RequestOutputKind


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat", help="chat interactively", description="Chat with the model; /exit to leave."
    )
    parser.add_argument("--system", default=None, help="a system message")
    add_sampling_args(parser, max_tokens=512)
    EngineArgs.add_cli_args(parser)
    add_log_level_arg(parser, default="warning")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    set_log_level(args.log_level)
    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    engine = llm.llm_engine
    tokenizer = engine.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template")
    messages = [{"role": "system", "content": args.system}] if args.system else []
    params = sampling_params_from_args(args, output_kind=RequestOutputKind.DELTA)
    for turn in iter_turns():
        messages.append({"role": "user", "content": turn})
        _, ids = render_chat(tokenizer, messages, add_generation_prompt=True)
        reply = []
        engine.add_request(f"chat-{len(messages)}", {"prompt_token_ids": ids}, params)
        while engine.has_unfinished_requests():
            for output in engine.step():
                reply.append(output.outputs[0].text)
                print(output.outputs[0].text, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})


def iter_turns():  # noqa: ANN201 - a generator of user turns
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            return
        if line in ("/exit", "/quit"):
            return
        if line:
            yield line
