"""The `pagedllm` command (pagedllm/entrypoints/cli.py): its subcommands, their --help,
dispatch, and exit statuses. Reference: argparse's and the shell's conventions (0 after
--help, 2 for a usage error with `prog: error: message` on stderr, 128 + SIGINT = 130 after
Ctrl-C); a bug (any other exception) is not hidden behind a status."""

import argparse
import subprocess
import sys

import pytest

from pagedllm.entrypoints import chat, cli, generate, inspect
from pagedllm.entrypoints.openai import api_server

COMMANDS = {"generate": generate, "chat": chat, "serve": api_server, "inspect": inspect}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def test_subcommands_are_the_documented_five() -> None:
    assert set(subcommands()) == {"generate", "chat", "serve", "bench", "inspect"}


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench", "inspect"])
def test_help_of_each_subcommand_exits_0(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: pagedllm {command}")


def test_top_level_help_lists_the_commands(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert all(command in out for command in subcommands())


def test_missing_or_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    for argv in ([], ["fly"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2
        assert "pagedllm: error:" in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_runs_its_modules_run(command: str) -> None:
    args = cli.build_parser().parse_args([command, *(["x"] if command == "inspect" else [])])
    assert args.func is COMMANDS[command].run
    assert args.command == command


@pytest.mark.parametrize(
    "error, status",
    [
        (ValueError("bad value"), 2),
        (TypeError("bad type"), 2),
        (FileNotFoundError("no such model"), 2),
        (KeyboardInterrupt(), 130),
    ],
)
def test_user_errors_exit_with_a_status_and_a_message(
    error: BaseException,
    status: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    def run(args: argparse.Namespace) -> None:
        raise error

    monkeypatch.setattr(generate, "run", run)
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "hi"])
    assert info.value.code == status
    if status == 2:
        assert capsys.readouterr().err == f"pagedllm generate: error: {error}\n"


def test_a_bug_is_not_turned_into_an_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(args: argparse.Namespace) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(chat, "run", run)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["chat"])


def test_the_command_does_not_import_torch_compile() -> None:
    """torch.compile's stack (torch._dynamo, imported by llguidance.torch's decorators and by
    transformers' modeling classes) took 2-4 s of every command's start; only the transformers
    bench peer needs it, when loaded. Checked in a fresh interpreter: this one has run the
    other tests."""
    code = (
        "import sys, pagedllm.entrypoints.cli; "
        "print(sorted({'torch._dynamo', 'transformers.modeling_utils'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
