"""Fixtures of the GGUF tests: the default model's file and tokenizer, and tiny GGUF files."""

import pytest

from pagedllm.config import default_model_path
from pagedllm.gguf.tokenizer import load_gguf_tokenizer
from tests.gguf.tiny_gguf import TINY, checkpoint_tensors, gguf_tensors, tiny_model, write_gguf


@pytest.fixture(scope="module")
def gguf_path() -> str:
    """The default model, SmolLM2-135M-Instruct Q4_1."""
    return default_model_path()


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return load_gguf_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, object, dict]]:
    """Each TINY architecture as a GGUF file: arch -> (path, HF config, checkpoint tensors)."""
    files = {}
    for arch in TINY:
        model = tiny_model(arch)
        path = str(tmp_path_factory.mktemp(arch) / f"{arch}.gguf")
        write_gguf(path, arch, model.config, gguf_tensors(arch, model.config, model.state_dict()))
        files[arch] = (path, model.config, checkpoint_tensors(model))
    return files
