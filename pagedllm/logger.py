"""The package logger: INFO to stderr with a short prefix, like vLLM's start-up lines;
interactive commands lower it to warnings so that nothing lands inside their answers."""

import argparse
import logging

_ROOT = "pagedllm"


def init_logger(name: str) -> logging.Logger:
    root = logging.getLogger(_ROOT)
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
    return logging.getLogger(name)


LOG_LEVELS = ("debug", "info", "warning", "error")


def set_log_level(level: str) -> None:
    """The package logger's level, one of LOG_LEVELS."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    init_logger(_ROOT).setLevel(level.upper())


def add_log_level_arg(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        help=f"pagedllm's log messages to show on stderr (default: {default})",
    )
