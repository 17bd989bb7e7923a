"""FlexibleArgumentParser against vLLM's command-line rules: underscores in flags, --config
YAML files (command line > file > defaults) and human-readable integers."""

import argparse

import pytest

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.entrypoints.cli import build_parser
from pagedllm.utils import FlexibleArgumentParser
from pagedllm.utils.argparse_utils import human_readable_int


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_underscored_flags_read_as_dashed():
    args = build_parser().parse_args(
        ["serve", "--max_model_len=512", "--max_num_seqs", "3", "--enforce_eager"]
    )
    assert (args.max_model_len, args.max_num_seqs, args.enforce_eager) == (512, 3, True)


def test_values_and_arguments_after_separator_are_left_alone():
    args = build_parser().parse_args(["generate", "--max_tokens", "2", "--", "--a_b"])
    assert args.prompt == "--a_b"


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    path = _config(
        tmp_path,
        "port: 23456\nmax_model_len: 2K\nenforce-eager: true\nenable-prefix-caching: false\n"
        "model: /from/config\nseed: 3\n",
    )
    args = build_parser().parse_args(["serve", "--config", path, "--port", "9"])
    assert (args.port, args.max_model_len, args.seed) == (9, 2048, 3)
    assert args.enforce_eager is True and args.enable_prefix_caching is False
    assert args.model == "/from/config"
    args = build_parser().parse_args(["serve", "/cli", f"--config={path}"])
    assert args.model == "/cli" and args.port == 23456


def test_false_switch_without_a_no_flag_is_left_off(tmp_path):
    path = _config(tmp_path, "enable-request-id-headers: false\n")
    assert build_parser().parse_args(["serve", "--config", path]).enable_request_id_headers is False


@pytest.mark.parametrize(
    ("text", "message"),
    [("[1", "is not YAML"), ("- a\n", "must hold a mapping"), ("bogus_key: 1\n", "--bogus-key")],
)
def test_bad_config_files_are_usage_errors(tmp_path, capsys, text, message):
    path = _config(tmp_path, text)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--config", path])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_config_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--config", str(tmp_path / "none.yaml")])
    assert "cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "value"),
    [("7", 7), ("-1", -1), ("25.6k", 25600), ("32K", 32768), ("1m", 10**6), ("1M", 2**20),
     ("2g", 2 * 10**9), ("1G", 2**30), ("1T", 2**40)],
)  # fmt: skip
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "2.00001k", "x", "1.5", ""])
def test_human_readable_int_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int(text)


def test_engine_args_on_vllm_style_parser():
    """vLLM's examples: parser = EngineArgs.add_cli_args(FlexibleArgumentParser())."""
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "m", "--kv_cache_memory_bytes", "1G"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.model == "m" and engine_args.kv_cache_memory_bytes == 2**30
