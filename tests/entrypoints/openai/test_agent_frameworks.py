"""The default tool loops of three agent frameworks against `pagedllm serve` on the default
model, whose template has no tool format (so the generic one, docs/tool-calling.md):
LangChain's `ChatOpenAI.bind_tools` (tools, no tool_choice), pydantic-ai's chat and
Responses models (tool_choice "auto") and the OpenAI Agents SDK's default Responses model
and its chat-completions model. Each asks for what the tool does; the reference is the
tool's schema: the tool must be called, with arguments that validate against it, and the
run must end in a text answer built after the tool's result."""

import jsonschema
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models import _openai_shared
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.entrypoints.openai.remote_server import MODEL_NAME, Server

# A request the default model answers with a call of get_weather at temperature 0.
MAX_TOKENS = 100  # a call takes ~20; a reply is cut there, which keeps the tests fast
QUESTION = "Use the get_weather tool to get the weather in Madrid."
WEATHER = "18 degrees and sunny"
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


class WeatherTool:
    """get_weather's calls, checked against SCHEMA as they come."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, city: str) -> str:
        """Get the current weather in a city."""
        arguments = {"city": city}
        jsonschema.validate(arguments, SCHEMA)
        self.calls.append(arguments)
        return WEATHER


@pytest.fixture
def weather() -> WeatherTool:
    return WeatherTool()


def test_langchain_bind_tools_round_trip(server: Server, weather: WeatherTool) -> None:
    llm = ChatOpenAI(model=MODEL_NAME, base_url=server.url + "/v1", api_key="unused", temperature=0)
    get_weather = tool("get_weather")(weather.__call__)
    bound = llm.bind_tools([get_weather])
    messages = [HumanMessage(QUESTION)]
    asked = bound.invoke(messages)
    assert isinstance(asked, AIMessage) and len(asked.tool_calls) == 1
    (call,) = asked.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], SCHEMA)
    messages += [asked, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = bound.invoke(messages)
    assert answer.tool_calls == [] and answer.content
    assert weather.calls == [call["args"]]


@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
def test_pydantic_ai_agent_calls_the_tool(
    server: Server, weather: WeatherTool, model_class: type
) -> None:
    provider = OpenAIProvider(base_url=server.url + "/v1", api_key="unused")
    model = model_class(MODEL_NAME, provider=provider)
    agent = PydanticAgent(model, model_settings={"temperature": 0, "max_tokens": MAX_TOKENS})
    agent.tool_plain(name="get_weather")(weather.__call__)
    result = agent.run_sync(QUESTION)
    assert len(weather.calls) == 1 and result.output


@pytest.fixture
def async_client(server: Server) -> openai.AsyncOpenAI:
    set_tracing_disabled(True)
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def default_responses_client(async_client: openai.AsyncOpenAI) -> object:
    """The Agents SDK's defaults (the Responses API) pointed at the server, for one test;
    the SDK's module state is put back after it."""
    before = _openai_shared.get_default_openai_client()
    set_default_openai_client(async_client, use_for_tracing=False)
    set_default_openai_api("responses")
    yield
    _openai_shared.set_default_openai_client(before)


def agents_sdk_run(model: object, weather: WeatherTool) -> object:
    get_weather = function_tool(weather.__call__, name_override="get_weather")
    agent = Agent(
        name="assistant",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
    )
    return Runner.run_sync(agent, QUESTION, max_turns=3)


def test_agents_sdk_default_responses_model(
    default_responses_client: object, weather: WeatherTool
) -> None:
    result = agents_sdk_run(MODEL_NAME, weather)
    assert len(weather.calls) == 1 and result.final_output


def test_agents_sdk_chat_completions_model(
    async_client: openai.AsyncOpenAI, weather: WeatherTool
) -> None:
    model = OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=async_client)
    result = agents_sdk_run(model, weather)
    assert len(weather.calls) == 1 and result.final_output
