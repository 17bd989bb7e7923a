"""`pagedllm generate` (pagedllm/entrypoints/generate.py). Reference: the offline LLM on the
default model: `LLM.generate` for a plain prompt, `LLM.chat` for a prompt sent as a user
message, with the same greedy parameters; streamed or not, the printed text is the same."""

import argparse
import io
import logging
from types import SimpleNamespace

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.entrypoints import generate
from pagedllm.entrypoints.cli import main
from pagedllm.logger import init_logger

PROMPT = "The capital of France is"
MAX_TOKENS = 6


@pytest.fixture
def llm_kwargs(offline_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> dict:
    """`pagedllm generate` runs on the session's offline LLM instead of loading the model
    again; the returned dict receives the LLM(...) arguments the command built."""
    kwargs = {}

    def make_llm(**engine_args: object) -> LLM:
        kwargs.update(engine_args)
        return offline_llm

    monkeypatch.setattr(generate, "LLM", make_llm)
    return kwargs


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    main(["generate", *argv])
    return capsys.readouterr().out


def test_plain_prompt_matches_llm_generate(
    offline_llm: LLM, llm_kwargs: dict, capsys: pytest.CaptureFixture
) -> None:
    out = run_cli([PROMPT, "--no-chat", "--max-tokens", str(MAX_TOKENS)], capsys)
    (expected,) = offline_llm.generate(PROMPT, greedy(), use_tqdm=False)
    assert out == expected.outputs[0].text + "\n"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_by_default_matches_llm_chat(
    offline_llm: LLM, llm_kwargs: dict, capsys: pytest.CaptureFixture, stream: bool
) -> None:
    """The default model has a chat template, so the prompt is sent as a user message."""
    flags = ["--max-tokens", str(MAX_TOKENS), "--max-model-len", "2048"]
    out = run_cli([PROMPT, *flags, *(["--stream"] if stream else [])], capsys)
    messages = [{"role": "user", "content": PROMPT}]
    (expected,) = offline_llm.chat(messages, greedy(), use_tqdm=False)
    assert out == expected.outputs[0].text + "\n"
    assert llm_kwargs["max_model_len"] == 2048 and llm_kwargs["model"] is None


def test_prompts_from_stdin_one_per_line(
    offline_llm: LLM,
    llm_kwargs: dict,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts = ["Once upon a time", "1, 2, 3,"]
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{prompts[0]}\n\n{prompts[1]}\n"))
    out = run_cli(["--no-chat", "--max-tokens", "3"], capsys)
    expected = offline_llm.generate(prompts, greedy(3), use_tqdm=False)
    assert out == "".join(e.outputs[0].text + "\n" for e in expected)


def test_read_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROMPT as given; "-" reads stdin, one prompt per non-blank line."""
    assert generate.read_prompts("hi there") == ["hi there"]
    monkeypatch.setattr("sys.stdin", io.StringIO("a b\n   \nc\n"))
    assert generate.read_prompts("-") == ["a b", "c"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n \n"))
    with pytest.raises(ValueError, match="no prompt given"):
        generate.read_prompts("-")


class FakeTokenizer:
    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool, tokenize: bool
    ) -> str:
        assert add_generation_prompt and not tokenize
        if self.chat_template == "refuses":
            raise RuntimeError("Conversation roles must alternate")
        return "".join(f"<{m['content']}>" for m in messages)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        assert not add_special_tokens  # the template placed them
        return [len(text)]


@pytest.mark.parametrize(
    "template, use_chat, wrapped",
    [
        ("T", None, True),  # default: the tokenizer's template decides
        (None, None, False),
        ("T", False, False),  # --no-chat
        ("T", True, True),  # --chat
    ],
)
def test_to_engine_prompt(template: str | None, use_chat: bool | None, wrapped: bool) -> None:
    engine = SimpleNamespace(tokenizer=FakeTokenizer(template))
    prompt = generate.to_engine_prompt(engine, "hello", use_chat)
    assert prompt == ({"prompt": "hello", "prompt_token_ids": [7]} if wrapped else "hello")


def test_a_template_that_raises_is_a_value_error() -> None:
    engine = SimpleNamespace(tokenizer=FakeTokenizer("refuses"))
    with pytest.raises(ValueError, match="cannot apply the chat template: Conversation roles"):
        generate.to_engine_prompt(engine, "hello", True)


def test_no_tokenizer_sends_the_text_as_is() -> None:
    engine = SimpleNamespace(tokenizer=None)
    assert generate.to_engine_prompt(engine, "hello", None) == "hello"


def test_chat_without_a_tokenizer_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`--chat --skip-tokenizer-init`: exit 2 with a message, as `pagedllm chat` does."""
    no_tokenizer = SimpleNamespace(llm_engine=SimpleNamespace(tokenizer=None))
    monkeypatch.setattr(generate, "LLM", lambda **engine_args: no_tokenizer)
    with pytest.raises(SystemExit) as info:
        main(["generate", "hi", "--chat", "--skip-tokenizer-init"])
    assert info.value.code == 2
    assert "pagedllm generate: error:" in capsys.readouterr().err


def test_parser_defaults() -> None:
    parser = argparse.ArgumentParser()
    generate.add_parser(parser.add_subparsers())
    args = parser.parse_args(["generate"])
    assert (args.prompt, args.stream, args.chat, args.max_tokens) == ("-", False, None, 256)


@pytest.mark.parametrize("flags,shown", [([], False), (["--log-level", "info"], True)])
def test_engine_log_lines_stay_out_of_the_answer_unless_asked(
    llm_kwargs: dict, capsys: pytest.CaptureFixture, flags: list[str], shown: bool
) -> None:
    """The engine's INFO lines (start-up, captured steps) would land inside a streamed
    answer: generate shows warnings only, unless --log-level says otherwise."""
    run_cli([PROMPT, "--no-chat", "--max-tokens", "2", *flags], capsys)
    assert init_logger("pagedllm.engine.llm_engine").isEnabledFor(logging.INFO) == shown
    assert init_logger("pagedllm.engine.llm_engine").isEnabledFor(logging.WARNING)
