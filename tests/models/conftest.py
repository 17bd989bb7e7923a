from collections.abc import Callable

import pytest

from tests.models.tiny_models import save_tiny_model, tiny_configs


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """name -> folder of a saved tiny random checkpoint, written once per session."""
    paths: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in paths:
            folder = tmp_path_factory.mktemp(name)
            save_tiny_model(tiny_configs()[name], str(folder))
            paths[name] = str(folder)
        return paths[name]

    return get
