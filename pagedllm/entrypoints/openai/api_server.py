"""`pagedllm serve [MODEL]`: an OpenAI-compatible HTTP server over the AsyncLLM.

Routes: POST /v1/completions, /v1/chat/completions, /v1/embeddings (on an embedding model),
/classify and /v1/classify (on a classifier), /score, /v1/score, /rerank, /v1/rerank and
/v2/rerank (on either: a bi-encoder or a cross-encoder), /pooling (any pooling model's raw
output, token classifiers' included), /v1/responses (with GET and DELETE
/v1/responses/{id} and POST /v1/responses/{id}/cancel), Anthropic's /v1/messages and
/v1/messages/count_tokens, GET /v1/models, POST /v1/load_lora_adapter and
/v1/unload_lora_adapter where runtime LoRA updating is on (all /v1 routes and /pooling
guarded by --api-key), and POST /tokenize, /detokenize, GET /health, /version, /metrics. FastAPI
serves the OpenAPI schema at /openapi.json and its docs at /docs.

Run as `pagedllm serve ...` or `python -m pagedllm.entrypoints.openai.api_server ...`.
"""

import argparse
import asyncio
import dataclasses
import importlib.metadata
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import NoReturn, TypeVar

import uvicorn
from fastapi import FastAPI
from transformers import PreTrainedTokenizerBase

from pagedllm.config import DEFAULT_MODEL_FILE
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.async_llm import AsyncLLM
from pagedllm.engine.batch_defaults import UsageContext
from pagedllm.engine.data_parallel import ENGINE_START_TIMEOUT_S
from pagedllm.engine.dp_remote import run_headless as run_dp_headless
from pagedllm.engine.protocol import EngineClient
from pagedllm.entrypoints.openai.access import (
    CorsConfig,
    add_access_args,
    add_access_middleware,
    api_keys,
    cors_from_args,
)
from pagedllm.entrypoints.openai.async_tokenizer import AsyncTokenizer
from pagedllm.entrypoints.openai.cli_args import add_vllm_serve_args, serve_model
from pagedllm.entrypoints.openai.errors import add_exception_handlers
from pagedllm.entrypoints.openai.metrics import ServerMetrics
from pagedllm.entrypoints.openai.reasoning import REASONING_PARSERS
from pagedllm.entrypoints.openai.request_id import RequestIdHeaderMiddleware
from pagedllm.entrypoints.openai.request_logger import RequestLogger
from pagedllm.entrypoints.openai.request_size import (
    DEFAULT_MAX_REQUEST_BYTES,
    RequestSizeLimitMiddleware,
)
from pagedllm.entrypoints.openai.response_store import (
    DEFAULT_MAX_STORED_RESPONSES,
    ResponseStore,
)
from pagedllm.entrypoints.openai.routes import router, runtime_lora_router
from pagedllm.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.openai.serving_classification import OpenAIServingClassification
from pagedllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from pagedllm.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from pagedllm.entrypoints.openai.serving_messages import AnthropicServingMessages
from pagedllm.entrypoints.openai.serving_models import (
    LoRAModulePath,
    OpenAIServingModels,
    check_lora_modules,
    runtime_lora_updating,
)
from pagedllm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from pagedllm.entrypoints.openai.serving_responses import OpenAIServingResponses
from pagedllm.entrypoints.openai.serving_score import OpenAIServingScore
from pagedllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from pagedllm.entrypoints.openai.tool_format import detect_tool_call_parser
from pagedllm.entrypoints.openai.tool_parsers import TOOL_PARSERS
from pagedllm.entrypoints.openai.uvicorn_server import APIServer
from pagedllm.executor.headless import run_headless
from pagedllm.logger import init_logger
from pagedllm.utils import FlexibleArgumentParser

logger = init_logger(__name__)

DEFAULT_SERVED_MODEL_NAME = DEFAULT_MODEL_FILE.split(".")[0]  # SmolLM2-135M-Instruct
T = TypeVar("T")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine: EngineClient = app.state.engine
    engine.start()
    watcher = asyncio.ensure_future(_stop_when_engine_dies(app))
    try:
        await _register_lora_modules(app)
        yield
    finally:
        watcher.cancel()
        await engine.shutdown()
        if getattr(app.state, "uvicorn_server", None) is not None:
            engine.close()  # now: after a SIGTERM, uvicorn re-raises it, ending the process
        app.state.tokenizer.shutdown()


async def _register_lora_modules(app: FastAPI) -> None:
    """--lora-modules, registered with the running engine; an adapter it refuses fails the
    start-up, and `_serve` reports why (app.state.startup_error)."""
    try:
        await app.state.serving_models.init_static_loras()
    except ValueError as e:
        app.state.startup_error = e
        raise


async def _stop_when_engine_dies(app: FastAPI) -> None:
    """A dead engine serves no one: tell uvicorn (if it runs the app) to stop, so `run`
    exits non-zero and a supervisor restarts the server, as vLLM does."""
    engine: EngineClient = app.state.engine
    await engine.dead.wait()
    logger.error("the engine died (%s); stopping the server", engine.dead_error)
    server = getattr(app.state, "uvicorn_server", None)
    if server is not None:
        server.should_exit = True


def registered(flag: str, name: str | None, registry: dict[str, T]) -> T | None:
    """The class registered as `name` (None for None); ValueError naming the known ones."""
    if name is not None and name not in registry:
        raise ValueError(f"{flag} {name!r} is not one of {sorted(registry)}")
    return None if name is None else registry[name]


def tool_call_parser_of(
    tokenizer: PreTrainedTokenizerBase, chat_template: str | None, tool_call_parser: str | None
) -> str:
    """`tool_call_parser` if given, else the format of the template that requests with
    tools go through (the server's --chat-template, else the tokenizer's; "generic" when
    there is none)."""
    if tool_call_parser is not None:
        return tool_call_parser
    try:
        template = tokenizer.get_chat_template(chat_template, tools=[{}])
    except ValueError:  # the tokenizer has no template; chat requests fail on their own
        template = None
    return detect_tool_call_parser(template)


def build_app(
    engine: EngineClient,
    served_model_names: list[str],
    api_key: list[str] | str | None = None,
    chat_template: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    cors: CorsConfig | None = None,
    max_stored_responses: int = DEFAULT_MAX_STORED_RESPONSES,
    request_logger: RequestLogger | None = None,
    default_chat_template_kwargs: dict | None = None,
    request_id_headers: bool = False,
    force_include_usage: bool = False,
    return_tokens_as_token_ids: bool = False,
    response_role: str = "assistant",
    lora_modules: Sequence[LoRAModulePath] = (),
) -> FastAPI:
    """The app over a (not yet started) engine; its lifespan starts and stops the engine
    and registers `lora_modules` with it. The parsers are named as in vLLM's
    --reasoning-parser and --tool-call-parser; without a tool-call parser the chat
    template's format is used ("auto" is always on)."""
    if engine.tokenizer is None:
        raise ValueError("the OpenAI server needs a tokenizer, but skip_tokenizer_init is set")
    models = OpenAIServingModels(engine, served_model_names, lora_modules)
    reasoning = registered("--reasoning-parser", reasoning_parser, REASONING_PARSERS)
    registered("--tool-call-parser", tool_call_parser, TOOL_PARSERS)
    tool_format = tool_call_parser_of(engine.tokenizer, chat_template, tool_call_parser)
    logger.info('tool calls of tool_choice "auto": the %s format', tool_format)
    app = FastAPI(
        title="pagedllm OpenAI-compatible API",
        version=importlib.metadata.version("pagedllm"),
        lifespan=_lifespan,
    )
    app.include_router(router)
    if runtime_lora_updating():
        logger.warning(
            "runtime LoRA updating is on: /v1/load_lora_adapter and "
            "/v1/unload_lora_adapter change the adapters served"
        )
        app.include_router(runtime_lora_router)
    add_exception_handlers(app)
    app.add_middleware(RequestSizeLimitMiddleware, max_bytes=max_request_bytes)
    add_access_middleware(app, api_keys(api_key), cors or CorsConfig())
    config = engine.config
    metrics = ServerMetrics(
        lambda: engine.stats_per_engine,
        served_model_names[0],
        config.model_config.max_model_len,
        config.cache_config,
    )
    tokenizer = AsyncTokenizer(engine.tokenizer)
    shared = (engine, tokenizer, models, metrics)
    app.state.engine = engine
    app.state.serving_models = models
    app.state.startup_error = None
    app.state.tokenizer = tokenizer
    app.state.metrics = metrics
    app.state.serving_completion = OpenAIServingCompletion(*shared, chat_template)
    app.state.serving_chat = OpenAIServingChat(
        *shared,
        chat_template,
        reasoning_parser=reasoning,
        tool_parser=TOOL_PARSERS[tool_format],
    )
    app.state.serving_responses = OpenAIServingResponses(
        app.state.serving_chat, ResponseStore(max_stored_responses)
    )
    app.state.serving_chat.response_role = response_role
    app.state.serving_messages = AnthropicServingMessages(app.state.serving_chat)
    app.state.serving_tokenization = OpenAIServingTokenization(
        *shared, chat_template, tool_parser=TOOL_PARSERS[tool_format]
    )
    app.state.serving_embedding = OpenAIServingEmbedding(*shared, chat_template)
    app.state.serving_score = OpenAIServingScore(app.state.serving_embedding)
    app.state.serving_classification = OpenAIServingClassification(app.state.serving_embedding)
    app.state.serving_pooling = OpenAIServingPooling(app.state.serving_embedding)
    for serving in (app.state.serving_completion, app.state.serving_chat):
        serving.request_logger = request_logger
        serving.force_include_usage = force_include_usage
        serving.return_tokens_as_token_ids = return_tokens_as_token_ids
    for serving in (app.state.serving_chat, app.state.serving_tokenization):
        serving.default_chat_template_kwargs = default_chat_template_kwargs or {}
    if request_id_headers:
        app.add_middleware(RequestIdHeaderMiddleware)
    app.state.serving_embedding.request_logger = request_logger
    return app


# The command line.


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a HF model folder or a .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    add_access_args(parser)
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the name(s) clients use in `model` (default: MODEL as given)",
    )
    parser.add_argument(
        "--chat-template", default=None, help="a Jinja chat template file (default: the model's)"
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='vLLM\'s flag, accepted for compatibility: tool_choice "auto" is always on',
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS),
        default=None,
        help="the model's tool-call format (default: the one its chat template teaches, "
        "else generic): hermes (Qwen2.5/3, Hermes: <tool_call>{...}</tool_call>), "
        "llama3_json (Llama 3.1/3.2 JSON calls), mistral ([TOOL_CALLS]), generic (the tools "
        "described in a system message, answers constrained to text or "
        '{"tool_calls": [...]}); see docs/tool-calling.md',
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        default=None,
        help="split <think>...</think> off the answer into reasoning_content: deepseek_r1 "
        "(DeepSeek-R1 and its distills), qwen3",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="larger request bodies get 413 before they are read (default 32 MiB)",
    )
    parser.add_argument(
        "--max-stored-responses",
        type=int,
        default=DEFAULT_MAX_STORED_RESPONSES,
        help="how many /v1/responses answers the server keeps in memory for GET and "
        "previous_response_id; the least recently used go first (default %(default)s)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=0.0,
        help="on SIGTERM or Ctrl-C, seconds the requests in flight may go on before they "
        "end with a 503 (vLLM's flag; default 0: at once)",
    )
    parser.add_argument(
        "--enable-log-requests",
        action="store_true",
        help="log each request the server submits: its id, prompt, token ids and "
        "parameters (vLLM's flag; off by default)",
    )
    parser.add_argument(
        "--max-log-len",
        type=int,
        default=None,
        help="with --enable-log-requests, at most this many prompt characters and token "
        "ids a line (default: all)",
    )
    parser.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="vLLM's older flag, accepted: requests are not logged unless --enable-log-requests",
    )
    parser.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    parser.add_argument(
        "--headless",
        action="store_true",
        help="run this node's ranks of a multi-node world (--nnodes, --node-rank > 0), or its "
        "data-parallel replicas (--data-parallel-start-rank > 0), without an API server: "
        "they follow the node that serves (docs/parallelism.md)",
    )
    add_vllm_serve_args(parser)
    EngineArgs.add_cli_args(parser, with_model=False)
    return parser


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (default: the embedded SmolLM2-135M-Instruct) at "
        "/v1/completions, /v1/chat/completions, /v1/responses, Anthropic's /v1/messages, "
        "/v1/embeddings, /v1/score and /v1/rerank (--runner pooling), /v1/classify (a "
        "classifier) and /v1/models, plus /score, /rerank, /classify, /pooling, /tokenize, "
        "/detokenize, /health, /version and /metrics.",
    )
    make_arg_parser(parser)
    parser.set_defaults(func=run)


def read_chat_template(path: str | None) -> str | None:
    """--chat-template as vLLM reads it: a file's template, or where no file opens, the
    value itself if it looks like a template (it holds `{`, `}` or a newline), with its
    backslash escapes (`\\n`) decoded, as a one-line template on a command line needs."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if not any(c in path for c in "{}\n"):
            raise ValueError(f"--chat-template {path!r} cannot be read: {e}") from e
    try:
        # Non-Latin-1 characters pass as \u escapes, so the decoding keeps them.
        return path.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise ValueError(f"--chat-template: a bad escape in the template: {e}") from e


def run(args: argparse.Namespace) -> None:
    """Serve until stopped; exits with status 1 if the engine died (see
    _stop_when_engine_dies)."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {args.max_log_len}")
    if not args.shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    args.model = serve_model(args)
    engine_args = EngineArgs.from_cli_args(args)
    if args.seed is not None:
        engine_args = dataclasses.replace(engine_args, seed=args.seed)
    engine_args.usage_context = UsageContext.OPENAI_API_SERVER  # vLLM's smaller default steps
    if args.headless and engine_args.data_parallel_size > 1:
        sys.exit(run_dp_headless(engine_args, ENGINE_START_TIMEOUT_S))
    if args.headless or engine_args.node_rank > 0:
        run_headless_node(args.headless, engine_args)
    chat_template = read_chat_template(args.chat_template)
    names = args.served_model_name or [args.model or DEFAULT_SERVED_MODEL_NAME]
    check_lora_modules_flag(args.lora_modules, engine_args.enable_lora, names)
    sockets = bind_server_sockets(args.host, args.port)  # before the model loads, as vLLM
    try:
        _serve(args, engine_args, chat_template, names, sockets)
    finally:
        for sock in sockets:
            sock.close()


def check_lora_modules_flag(
    modules: list[LoRAModulePath], enable_lora: bool, served_model_names: list[str]
) -> None:
    """--lora-modules' rules, checked before the model loads: they need --enable-lora,
    and names of their own (serving_models.check_lora_modules)."""
    if modules and not enable_lora:
        names = [module.name for module in modules]
        raise ValueError(f"--lora-modules {names} needs --enable-lora (LoRA is off)")
    check_lora_modules(modules, served_model_names)


def bind_server_sockets(host: str, port: int) -> list[socket.socket]:
    """The API's listening sockets, one per address `host` resolves to (as asyncio's server
    binds them), bound before the engine starts as vLLM binds its socket: an address that
    cannot be taken is a ValueError now, not uvicorn's error after the model has loaded.
    With port 0 every address takes the port the first one got."""
    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # its own address only, beside an IPv4 one
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise ValueError(f"cannot listen at {host}:{port} (--host, --port): {e}") from e
    return sockets


def _serve(
    args: argparse.Namespace,
    engine_args: EngineArgs,
    chat_template: str | None,
    names: list[str],
    sockets: list[socket.socket],
) -> None:
    engine = AsyncLLM.from_engine_args(engine_args)
    app = build_app(
        engine,
        names,
        args.api_key,
        chat_template,
        args.max_request_bytes,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        cors=cors_from_args(args),
        max_stored_responses=args.max_stored_responses,
        request_logger=RequestLogger(args.max_log_len) if args.enable_log_requests else None,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        request_id_headers=args.enable_request_id_headers,
        force_include_usage=args.enable_force_include_usage,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        response_role=args.response_role,
        lora_modules=args.lora_modules,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        root_path=args.root_path,
    )
    _check_lora_modules(engine, app.state.serving_models)
    app.state.uvicorn_server = server = APIServer(config, engine, args.shutdown_timeout)
    port = sockets[0].getsockname()[1]
    logger.info("serving %s at http://%s:%d/v1", names[0], args.host, port)
    try:
        server.run(sockets=sockets)
    except SystemExit:  # uvicorn's when the start-up failed: a bad flag's exit, if one did
        if app.state.startup_error is not None:
            raise app.state.startup_error from None
        raise
    finally:
        engine.close()  # tensor-parallel workers stop with the server
    if engine.dead_error is not None:
        print(f"pagedllm serve: the engine died: {engine.dead_error}", file=sys.stderr)
        sys.exit(1)


def _check_lora_modules(engine: AsyncLLM, serving_models: OpenAIServingModels) -> None:
    """--lora-modules checked by the engine before uvicorn starts (and before the engine's
    thread does): a refused adapter ends the start-up with its reason alone, where the
    app's lifespan would print uvicorn's traceback first. The lifespan registers them again,
    as known adapters."""
    for lora in serving_models.static_lora_requests():
        try:
            engine.engine.add_lora(lora)
        except (ValueError, TypeError) as e:
            raise ValueError(f"--lora-modules {lora.lora_name}={lora.lora_path}: {e}") from None


def run_headless_node(headless: bool, engine_args: EngineArgs) -> NoReturn:
    """vLLM's --headless: this node's ranks follow rank 0's node, which serves."""
    config = engine_args.create_engine_config()
    if not headless:
        raise ValueError(
            f"--node-rank {engine_args.node_rank} runs no API server (node 0 serves): "
            "add --headless"
        )
    run_headless(config)


def main(argv: list[str] | None = None) -> None:
    parser = make_arg_parser(FlexibleArgumentParser(prog="pagedllm serve"))
    args = parser.parse_args(argv)
    try:
        run(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"pagedllm serve: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
