"""`pagedllm serve`'s flags that vLLM's launch scripts and docs pass beside the engine's:
each does what vLLM's does, or is accepted where pagedllm already behaves as it asks, or
refuses a value it cannot honour with a message naming it (argparse's choices)."""

import argparse
import json

from pagedllm.entrypoints.openai.serving_models import LoRAModulePath
from pagedllm.value_checks import as_json_object

STRUCTURED_OUTPUTS_BACKENDS = ("auto", "guidance")
"""vLLM's backend names pagedllm answers to: llguidance is its one backend."""


def add_vllm_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="read flags from a YAML file of long flag names and values (`port: 8000`, "
        "`max-model-len: 4096`, `model: PATH`); the command line's own flags win (vLLM's flag)",
    )
    parser.add_argument(
        "--model",
        dest="model_option",
        default=None,
        help="the model, as vLLM's deprecated --model (the positional MODEL is preferred)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the engine's random seed (default 0)"
    )
    parser.add_argument(
        "--root-path",
        default="",
        help="the path prefix a proxy serves the API under (uvicorn's root_path, vLLM's flag)",
    )
    parser.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object,
        default=None,
        help="chat template arguments every request gets unless it sets them itself "
        "(a JSON object, e.g. '{\"enable_thinking\": false}'; vLLM's flag)",
    )
    parser.add_argument(
        "--chat-template-content-format",
        choices=("auto", "string"),
        default="auto",
        help="vLLM's flag: templates get message content as a string (text parts joined)",
    )
    parser.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        help="answer with an X-Request-Id header: the request's own, else a new id (vLLM's flag)",
    )
    parser.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="every stream carries the usage in each chunk and at its end, whatever its "
        "stream_options (vLLM's flag)",
    )
    parser.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="logprobs name tokens as 'token_id:<id>' unless a request's "
        "return_tokens_as_token_ids says otherwise (vLLM's flag)",
    )
    parser.add_argument(
        "--response-role",
        default="assistant",
        help="the role of chat answers where the request's add_generation_prompt is true "
        "(else the last message's, which the answer continues; vLLM's flag)",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="vLLM's flag, accepted: usage.prompt_tokens_details.cached_tokens is always sent",
    )
    parser.add_argument(
        "--lora-modules",
        nargs="+",
        type=lora_module_path,
        default=[],
        metavar="MODULE",
        help="LoRA adapters to serve (with --enable-lora), each as name=path or as JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'; a request runs one by '
        "putting its name in `model` (vLLM's flag; docs/serving.md#lora-adapters)",
    )
    parser.add_argument(
        "--structured-outputs-config.backend",
        dest="structured_outputs_backend",
        choices=STRUCTURED_OUTPUTS_BACKENDS,
        default="auto",
        help="vLLM's flag: pagedllm's structured outputs run llguidance ('guidance')",
    )


def serve_model(args: argparse.Namespace) -> str | None:
    """MODEL, given as the positional or as --model (not both, unless the same)."""
    if args.model_option is not None and args.model not in (None, args.model_option):
        raise ValueError(
            f"the model is given twice: {args.model!r} and --model {args.model_option!r}"
        )
    return args.model or args.model_option


def lora_module_path(text: str) -> LoRAModulePath:
    """One --lora-modules value, in vLLM's forms: `name=path`, or a JSON object with
    `name`, `path` and optionally `base_model_name`."""
    if "=" in text and not text.lstrip().startswith("{"):
        name, _, path = text.partition("=")
        fields = {"name": name, "path": path}
    else:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither name=path nor a JSON object: {e}"
            ) from None
    if not isinstance(fields, dict):
        raise argparse.ArgumentTypeError(f"{text!r} must be name=path or a JSON object")
    return _lora_module(text, fields)


def _lora_module(text: str, fields: dict) -> LoRAModulePath:
    if not {"name", "path"} <= set(fields) <= {"name", "path", "base_model_name"}:
        raise argparse.ArgumentTypeError(
            f"{text!r} must have `name` and `path` (and may have `base_model_name`), "
            f"got {sorted(fields)}"
        )
    for key, value in fields.items():
        if value is None and key == "base_model_name":
            continue
        if not isinstance(value, str) or not value:
            raise argparse.ArgumentTypeError(f"{text!r}: `{key}` must be a non-empty string")
    return LoRAModulePath(**fields)


def _json_object(text: str) -> dict:
    """value_checks' rule, as argparse reports a flag's bad value."""
    try:
        return as_json_object("--default-chat-template-kwargs", text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
