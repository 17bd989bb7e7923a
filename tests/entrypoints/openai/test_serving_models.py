"""LoRA adapters on the server (pagedllm/entrypoints/openai/serving_models.py and the
endpoints that resolve `model`), over a fake engine that records the lora_request each
request runs with. Reference: vLLM's behaviour (serving_models.py, `--lora-modules`,
VLLM_ALLOW_RUNTIME_LORA_UPDATING): an adapter's name in `model` runs that adapter and is
echoed in the answer; /v1/models lists each adapter with its folder as `root` and its base
as `parent`; load/unload answer 200 with a plain-text message, 400 for a name in use, a
missing field or an adapter the engine refuses, 404 for unloading an unknown name."""

import asyncio
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from transformers import PreTrainedTokenizerBase

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.stats import EngineStats
from pagedllm.engine.tokenizer import get_tokenizer
from pagedllm.entrypoints.openai import api_server
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.serving_models import (
    RUNTIME_LORA_UPDATING_ENVS,
    LoRAModulePath,
    OpenAIServingModels,
    runtime_lora_updating,
)
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.sampling_params import SamplingParams

TOKEN = 1000  # what the fake engine answers: not an EOS of the default model
SQL = LoRARequest("sql", 1, "/adapters/sql")
LAW = LoRARequest("law", 2, "/adapters/law", "m")
MODULES = [LoRAModulePath("sql", "/adapters/sql"), LoRAModulePath("law", "/adapters/law", "m")]
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MESSAGES = [{"role": "user", "content": "Hi"}]


class LoRAEngine:
    """A fake AsyncLLM: the default model's config and tokenizer, every request answered
    with TOKEN (and two candidates' logprobs where asked, as a beam search's steps ask),
    the lora_request of each recorded. add_lora refuses a path holding "bad", as the engine
    refuses an adapter it cannot use (ValueError)."""

    def __init__(self, config: EngineConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.stats = EngineStats(0, 0, 0, 0.0, 1, 1, 0, 0, 0, 0)
        self.stats_per_engine = [self.stats]
        self.dead, self.dead_error, self.is_running = asyncio.Event(), None, True
        self.asked: list[LoRARequest | None] = []
        self.loras: dict[int, LoRARequest] = {}

    def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def close(self) -> None:
        pass

    def has_request(self, request_id: str) -> bool:
        return False

    async def generate(
        self,
        prompt: dict,
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        self.asked.append(lora_request)
        logprobs = None
        if params.logprobs is not None:
            logprobs = [{TOKEN: Logprob(-0.5), TOKEN + 1: Logprob(-1.0)}]
        answer = CompletionOutput(0, "hi", [TOKEN], -0.5, logprobs, "length")
        ids = prompt["prompt_token_ids"]
        yield RequestOutput(request_id, prompt.get("prompt"), ids, None, [answer], True)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        await asyncio.sleep(0)  # the engine thread's turn: another load may run meanwhile
        return self.add_lora_now(lora_request)

    def add_lora_now(self, lora_request: LoRARequest) -> bool:
        if "bad" in lora_request.lora_path:
            raise ValueError(f"lora_path {lora_request.lora_path!r} holds no adapter_config.json")
        self.loras[lora_request.lora_int_id] = lora_request
        return True

    @property
    def engine(self) -> SimpleNamespace:
        """AsyncLLM's engine, called before its thread starts (api_server's check of
        --lora-modules)."""
        return SimpleNamespace(add_lora=self.add_lora_now)

    async def remove_lora(self, lora_int_id: int) -> bool:
        return self.loras.pop(lora_int_id, None) is not None

    async def list_loras(self) -> set[int]:
        return set(self.loras)


@pytest.fixture(scope="module")
def config() -> EngineConfig:
    return EngineArgs(enable_lora=True).create_engine_config()


@pytest.fixture(scope="module")
def tokenizer(config: EngineConfig) -> PreTrainedTokenizerBase:
    return get_tokenizer(config.model_config)


@pytest.fixture
def engine(config: EngineConfig, tokenizer: PreTrainedTokenizerBase) -> LoRAEngine:
    return LoRAEngine(config, tokenizer)


@pytest.fixture
def http(engine: LoRAEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """A server of "m" with the adapters sql and law (--lora-modules), runtime updating off."""
    for name in RUNTIME_LORA_UPDATING_ENVS:
        monkeypatch.delenv(name, raising=False)
    with TestClient(api_server.build_app(engine, ["m"], lora_modules=MODULES)) as client:
        yield client


def post(http: TestClient, path: str, body: dict, status: int = 200) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


# --lora-modules at start-up.


def test_lora_modules_are_registered_at_start_up_with_ids_1_2_in_order(
    http: TestClient, engine: LoRAEngine
) -> None:
    assert engine.loras == {1: SQL, 2: LAW}
    assert [lora.lora_int_id for lora in engine.loras.values()] == [1, 2]
    assert engine.loras[2].base_model_name == "m"


def test_an_adapter_the_engine_refuses_fails_the_start_up_naming_it(engine: LoRAEngine) -> None:
    modules = [*MODULES, LoRAModulePath("broken", "/adapters/bad")]
    app = api_server.build_app(engine, ["m"], lora_modules=modules)
    message = r"--lora-modules broken=/adapters/bad: lora_path '/adapters/bad' holds no"
    with pytest.raises(ValueError, match=message), TestClient(app):
        pass
    assert str(app.state.startup_error).startswith("--lora-modules broken=")


def test_pagedllm_serve_exits_2_naming_the_adapter_the_engine_refuses(
    engine: LoRAEngine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The whole command: the engine refuses the adapter before uvicorn starts, and the
    command says why as it does for a bad flag, with no traceback."""
    monkeypatch.setattr(api_server.AsyncLLM, "from_engine_args", lambda engine_args: engine)
    argv = ["--port", "0", "--enable-lora", "--lora-modules", "sql=/adapters/sql"]
    with pytest.raises(SystemExit) as exit_info:
        api_server.main([*argv, "broken=/adapters/bad"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    message = "error: --lora-modules broken=/adapters/bad: lora_path '/adapters/bad' holds no"
    assert message in err and "Traceback" not in err and "startup failed" not in err


@pytest.mark.parametrize(
    "modules, message",
    [
        ([LoRAModulePath("m", "/a")], "the adapter name 'm' is a served model name"),
        ([*MODULES, LoRAModulePath("sql", "/b")], r"names the adapters \['sql'\] more than"),
    ],
)
def test_build_app_refuses_adapter_names_that_are_not_their_own(
    engine: LoRAEngine, modules: list[LoRAModulePath], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        api_server.build_app(engine, ["m"], lora_modules=modules)


# `model` names an adapter.


def completion(model: str) -> tuple[str, dict]:
    return "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1}


def chat(model: str) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 1}


def response(model: str) -> tuple[str, dict]:
    return "/v1/responses", {"model": model, "input": "Hi", "max_output_tokens": 1}


def message(model: str) -> tuple[str, dict]:
    return "/v1/messages", {"model": model, "messages": MESSAGES, "max_tokens": 1}


def beam_completion(model: str) -> tuple[str, dict]:
    path, body = completion(model)
    return path, {**body, "use_beam_search": True, "n": 1}


def beam_chat(model: str) -> tuple[str, dict]:
    path, body = chat(model)
    return path, {**body, "use_beam_search": True, "n": 1}


ENDPOINTS = [completion, chat, response, message, beam_completion, beam_chat]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("model, lora", [("sql", SQL), ("law", LAW), ("m", None)])
def test_the_model_field_picks_the_adapter_and_the_answer_names_it(
    http: TestClient, engine: LoRAEngine, endpoint, model: str, lora: LoRARequest | None
) -> None:
    """Every request the answer took (each beam search step's too) ran with the adapter
    `model` names (the very LoRARequest registered, with its id), none for the base."""
    answer = post(http, *endpoint(model))
    assert answer["model"] == model
    assert engine.asked and all(asked == lora for asked in engine.asked)
    ids = {asked.lora_int_id for asked in engine.asked if asked is not None}
    assert ids == ({lora.lora_int_id} if lora else set())


@pytest.mark.parametrize("endpoint", ENDPOINTS[:4])
def test_a_name_neither_served_nor_loaded_is_still_a_404(
    http: TestClient, engine: LoRAEngine, endpoint
) -> None:
    path, body = endpoint("legal")
    response = http.post(path, json=body)
    assert response.status_code == 404, response.text
    assert "legal" in response.text and "'sql', 'law'" in response.text
    assert engine.asked == []


def test_tokenization_endpoints_take_an_adapters_name(http: TestClient) -> None:
    tokens = post(http, "/tokenize", {"model": "sql", "prompt": "Hi"})["tokens"]
    assert post(http, "/detokenize", {"model": "law", "tokens": tokens})["prompt"] == "Hi"


def test_v1_models_lists_each_adapter_under_its_base(http: TestClient, config) -> None:
    cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert list(cards) == ["m", "sql", "law"]
    assert cards["m"]["root"] == config.model_config.model and cards["m"]["parent"] is None
    assert (cards["sql"]["root"], cards["sql"]["parent"]) == ("/adapters/sql", "m")
    assert (cards["law"]["root"], cards["law"]["parent"]) == ("/adapters/law", "m")


def test_an_adapters_parent_is_its_base_model_name_else_the_first_served(
    engine: LoRAEngine,
) -> None:
    modules = [LoRAModulePath("sql", "/a"), LoRAModulePath("law", "/b", "alias")]
    app = api_server.build_app(engine, ["m", "alias"], lora_modules=modules)
    with TestClient(app) as http:
        cards = http.get("/v1/models").json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [
        ("m", None),
        ("alias", None),
        ("sql", "m"),
        ("law", "alias"),
    ]


# Runtime loading and unloading.


def load(http: TestClient, body: dict, status: int = 200) -> str:
    response = http.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == status, response.text
    return response.text if status == 200 else response.json()["error"]["message"]


def unload(http: TestClient, body: dict, status: int = 200) -> str:
    response = http.post("/v1/unload_lora_adapter", json=body)
    assert response.status_code == status, response.text
    return response.text if status == 200 else response.json()["error"]["message"]


@pytest.fixture
def runtime_http(engine: LoRAEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """`http` with runtime updating on."""
    monkeypatch.setenv(RUNTIME_ENV, "1")
    with TestClient(api_server.build_app(engine, ["m"], lora_modules=MODULES)) as client:
        yield client


def test_without_the_env_var_the_update_routes_do_not_exist(http: TestClient) -> None:
    load(http, {"lora_name": "tax", "lora_path": "/adapters/tax"}, 404)
    unload(http, {"lora_name": "sql"}, 404)


def test_a_loaded_adapter_is_served_and_an_unloaded_one_is_gone(
    runtime_http: TestClient, engine: LoRAEngine
) -> None:
    text = load(runtime_http, {"lora_name": "tax", "lora_path": "/adapters/tax"})
    assert text == "Success: LoRA adapter 'tax' added successfully."
    tax = LoRARequest("tax", 3, "/adapters/tax")
    assert engine.loras[3] == tax and engine.loras[3].lora_int_id == 3
    assert post(runtime_http, *completion("tax"))["model"] == "tax"
    assert engine.asked == [tax] and engine.asked[0].lora_int_id == 3
    models = runtime_http.get("/v1/models").json()["data"]
    assert ("tax", "/adapters/tax", "m") in [(c["id"], c["root"], c["parent"]) for c in models]

    text = unload(runtime_http, {"lora_name": "tax"})
    assert text == "Success: LoRA adapter 'tax' removed successfully."
    assert 3 not in engine.loras
    post(runtime_http, *completion("tax"), status=404)
    assert "tax" not in [c["id"] for c in runtime_http.get("/v1/models").json()["data"]]


def test_ids_are_never_reused(runtime_http: TestClient, engine: LoRAEngine) -> None:
    """The next adapter gets the next id even after one was unloaded (the engine may
    still hold what it cached under an old id)."""
    unload(runtime_http, {"lora_name": "law"})
    load(runtime_http, {"lora_name": "law", "lora_path": "/adapters/law2"})
    assert sorted(engine.loras) == [1, 3]
    post(runtime_http, *chat("law"))
    assert engine.asked[0].lora_int_id == 3 and engine.asked[0].lora_path == "/adapters/law2"


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"lora_name": "sql", "lora_path": "/x"},
            "The lora adapter 'sql' has already been loaded.",
        ),
        ({"lora_name": "m", "lora_path": "/x"}, "'m' is a served model's name"),
        (
            {"lora_name": "", "lora_path": "/x"},
            "Both 'lora_name' and 'lora_path' must be provided.",
        ),
        (
            {"lora_name": "tax", "lora_path": ""},
            "Both 'lora_name' and 'lora_path' must be provided.",
        ),
        ({"lora_name": "tax"}, "lora_path: Field required"),
        ({"lora_path": "/x"}, "lora_name: Field required"),
        (
            {"lora_name": "tax", "lora_path": "/adapters/bad"},
            "lora_path '/adapters/bad' holds no adapter_config.json",
        ),
    ],
)
def test_a_load_that_cannot_be_done_is_a_400_and_changes_nothing(
    runtime_http: TestClient, engine: LoRAEngine, body: dict, message: str
) -> None:
    assert message in load(runtime_http, body, 400)
    assert engine.loras == {1: SQL, 2: LAW}
    assert [c["id"] for c in runtime_http.get("/v1/models").json()["data"]] == ["m", "sql", "law"]


def test_unloading_an_unknown_name_is_a_404(runtime_http: TestClient) -> None:
    assert unload(runtime_http, {"lora_name": "tax"}, 404) == (
        "The lora adapter 'tax' cannot be found."
    )
    assert unload(runtime_http, {}, 400) == "lora_name: Field required"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, False),
        ({RUNTIME_ENV: "1"}, True),
        ({RUNTIME_ENV: "true"}, True),
        ({RUNTIME_ENV: "0"}, False),
        ({"PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, True),
        ({"PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING": "0", RUNTIME_ENV: "1"}, False),
    ],
)
def test_runtime_updating_follows_the_env_vars(
    monkeypatch: pytest.MonkeyPatch, env: dict, expected: bool
) -> None:
    for name in RUNTIME_LORA_UPDATING_ENVS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert runtime_lora_updating() is expected


def test_a_bad_env_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_ENV, "maybe")
    with pytest.raises(ValueError, match=f"{RUNTIME_ENV}='maybe': use 1 or 0"):
        runtime_lora_updating()


def test_concurrent_loads_of_one_name_load_it_once(engine: LoRAEngine) -> None:
    """Loads and unloads run one at a time: of two loads of one name racing, the second
    finds the first's adapter loaded (without the lock both would pass the check while the
    engine loads, and the name would get two ids)."""
    models = OpenAIServingModels(engine, ["m"])

    async def race() -> list:
        loads = [models.load_lora_adapter("tax", f"/adapters/tax{i}") for i in range(2)]
        return await asyncio.gather(*loads, return_exceptions=True)

    first, second = asyncio.run(race())
    assert first == "Success: LoRA adapter 'tax' added successfully."
    assert isinstance(second, OpenAIError) and second.status_code == 400
    assert list(engine.loras) == [1] and models.lora_requests == {"tax": engine.loras[1]}
