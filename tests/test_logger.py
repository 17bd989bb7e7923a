"""pagedllm/logger.py. Reference: its contract with the logging module: the package's
"pagedllm" logger gets one stderr handler (INFO, `LEVEL HH:MM:SS message`, not passed on
to the root logger) however many modules ask for a logger, and a module's logger is a
child of it."""

import logging
import sys

import pytest

from pagedllm.logger import init_logger


@pytest.fixture
def bare_package_logger(monkeypatch: pytest.MonkeyPatch) -> logging.Logger:
    """The "pagedllm" logger as before any init_logger call; restored afterwards."""
    root = logging.getLogger("pagedllm")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.NOTSET)
    monkeypatch.setattr(root, "propagate", True)
    return root


def test_one_handler_however_many_loggers(bare_package_logger: logging.Logger) -> None:
    first = init_logger("pagedllm.engine.llm_engine")
    second = init_logger("pagedllm.entrypoints.openai.api_server")
    assert first.name == "pagedllm.engine.llm_engine" and first.parent is bare_package_logger
    assert second.getEffectiveLevel() == logging.INFO
    (handler,) = bare_package_logger.handlers
    assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
    assert not bare_package_logger.propagate


def test_line_format(bare_package_logger: logging.Logger) -> None:
    init_logger("pagedllm.x")
    (handler,) = bare_package_logger.handlers
    record = logging.LogRecord(
        "pagedllm.x", logging.WARNING, __file__, 1, "KV cache %s", ("ok",), None
    )
    record.created = 0.0
    text = handler.format(record)
    assert text.startswith("WARNING ") and text.endswith(" KV cache ok")
    clock = text.split(" ")[1]
    assert len(clock) == 8 and clock[2] == clock[5] == ":"
