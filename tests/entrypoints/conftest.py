"""The offline `LLM` on the default model, shared by the CLI tests (generate, chat) and the
OpenAI server's tests (their reference): loaded once per session."""

import logging
from collections.abc import Iterator

import pytest

from pagedllm import LLM
from tests.entrypoints.openai.remote_server import MAX_MODEL_LEN


@pytest.fixture(scope="session")
def offline_llm() -> LLM:
    """The reference: the default model, run offline in this process, dequantized like the
    test server's (remote_server.py): these tests compare texts across batch compositions,
    which float32 keeps and 8-bit activations do not, bit for bit."""
    return LLM(num_kv_blocks=256, max_model_len=MAX_MODEL_LEN, quantization="none", dtype="float32")


@pytest.fixture(autouse=True)
def package_log_level() -> Iterator[None]:
    """generate and chat set the package logger's level (--log-level); restored after each
    test, as a command's process would end."""
    logger = logging.getLogger("pagedllm")
    level = logger.level
    yield
    logger.setLevel(level)
