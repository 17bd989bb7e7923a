"""`pagedllm chat` (pagedllm/entrypoints/chat.py). Reference: the offline `LLM.chat` on the
default model with the same greedy parameters, given the conversation so far (the system
message, each user turn and the replies before it)."""

import argparse
from types import SimpleNamespace

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.entrypoints import chat
from pagedllm.entrypoints.cli import main

SYSTEM = "You are terse."
TURNS = ["Name a colour.", "Another one?"]
MAX_TOKENS = 8


def scripted_input(lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """input() returns `lines` one by one, then raises EOFError (Ctrl-D)."""
    remaining = iter(lines)

    def fake_input(prompt: str) -> str:
        assert prompt == "> "
        try:
            return next(remaining)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)


@pytest.mark.parametrize(
    "lines, turns",
    [
        (["hi", "", "   ", " there ", "/exit", "unreached"], ["hi", "there"]),
        (["hi", "/quit", "unreached"], ["hi"]),
        (["hi"], ["hi"]),  # then EOF
        ([], []),
    ],
)
def test_iter_turns(lines: list[str], turns: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Blank lines are skipped; /exit, /quit and EOF end the chat."""
    scripted_input(lines, monkeypatch)
    assert list(chat.iter_turns()) == turns


def test_conversation_matches_llm_chat(
    offline_llm: LLM, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(chat, "LLM", lambda **engine_args: offline_llm)
    scripted_input([*TURNS, "/exit"], monkeypatch)
    capsys.readouterr()
    main(["chat", "--system", SYSTEM, "--max-tokens", str(MAX_TOKENS)])
    printed = capsys.readouterr().out

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    messages, replies = [{"role": "system", "content": SYSTEM}], []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        (output,) = offline_llm.chat(messages, params, use_tqdm=False)
        replies.append(output.outputs[0].text)
        messages.append({"role": "assistant", "content": replies[-1]})
    assert printed == "".join(reply + "\n" for reply in replies)


def test_a_tokenizer_without_chat_template_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    no_template = SimpleNamespace(llm_engine=SimpleNamespace(tokenizer=None))
    monkeypatch.setattr(chat, "LLM", lambda **engine_args: no_template)
    with pytest.raises(SystemExit) as info:
        main(["chat", "--skip-tokenizer-init"])
    assert info.value.code == 2
    assert "pagedllm chat: error: this model's tokenizer has no chat template" in (
        capsys.readouterr().err
    )


class RefusingTokenizer:
    """A tokenizer whose template raises, as Gemma's does on a system message."""

    chat_template = "{{ raise_exception('System role not supported') }}"

    def apply_chat_template(self, *args: object, **kwargs: object) -> str:
        raise RuntimeError("System role not supported")


def test_a_template_that_raises_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    refusing = SimpleNamespace(llm_engine=SimpleNamespace(tokenizer=RefusingTokenizer()))
    monkeypatch.setattr(chat, "LLM", lambda **engine_args: refusing)
    scripted_input(["hi"], monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(["chat", "--system", SYSTEM])
    assert info.value.code == 2
    assert (
        "pagedllm chat: error: cannot apply the chat template: System role not supported"
        in capsys.readouterr().err
    )


def test_parser_defaults() -> None:
    parser = argparse.ArgumentParser()
    chat.add_parser(parser.add_subparsers())
    args = parser.parse_args(["chat"])
    assert (args.system, args.max_tokens, args.temperature) == (None, 512, 0.0)
