"""OpenAIServingModels (vLLM's): the names a server answers to in a request's `model`: its
served model names, and the LoRA adapters served beside them (pagedllm/lora/request.py),
given by --lora-modules at start-up or, where runtime updating is on
(RUNTIME_LORA_UPDATING_ENVS), loaded and unloaded through POST /v1/load_lora_adapter and
/v1/unload_lora_adapter. GET /v1/models lists them all. Every serving object of one app
shares the one instance, so an adapter loaded at runtime is known to every endpoint."""

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from pagedllm.engine.protocol import EngineClient
from pagedllm.entrypoints.openai.errors import OpenAIError
from pagedllm.entrypoints.openai.responses import ModelCard, ModelList
from pagedllm.logger import init_logger
from pagedllm.lora.request import LoRARequest
from pagedllm.value_checks import env_flag

logger = init_logger(__name__)

RUNTIME_LORA_UPDATING_ENVS = (
    "PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
)


@dataclass(frozen=True)
class LoRAModulePath:
    """One --lora-modules value: the adapter's `name` (what requests put in `model`), its
    folder `path`, and the served model /v1/models names as its parent (None: the first
    served name)."""

    name: str
    path: str
    base_model_name: str | None = None


def runtime_lora_updating() -> bool:
    """Whether the load and unload routes are served: the first of
    RUNTIME_LORA_UPDATING_ENVS that is set, as a switch (off when neither is)."""
    flags = [env_flag(name) for name in RUNTIME_LORA_UPDATING_ENVS]
    return next((flag for flag in flags if flag is not None), False)


def check_lora_modules(modules: Sequence[LoRAModulePath], served_model_names: list[str]) -> None:
    """Each adapter needs a name of its own (no served model's, no other adapter's), and a
    `base_model_name` must be a served model's."""
    names = [module.name for module in modules]
    for module in modules:
        if module.name in served_model_names:
            raise ValueError(
                f"--lora-modules: the adapter name {module.name!r} is a served model name "
                f"({served_model_names}); give the adapter a name of its own"
            )
        if module.base_model_name not in (None, *served_model_names):
            raise ValueError(
                f"--lora-modules: base_model_name {module.base_model_name!r} of adapter "
                f"{module.name!r} is not a served model name ({served_model_names})"
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"--lora-modules names the adapters {repeated} more than once; each needs a "
            "name of its own"
        )


class OpenAIServingModels:
    def __init__(
        self,
        engine: EngineClient,
        served_model_names: list[str],
        lora_modules: Sequence[LoRAModulePath] = (),
    ) -> None:
        """`lora_modules`: --lora-modules, registered with the engine by
        `init_static_loras` once it runs."""
        if not served_model_names:
            raise ValueError("served_model_names must name at least one model")
        check_lora_modules(lora_modules, served_model_names)
        self.engine = engine
        self.served_model_names = served_model_names
        self.static_lora_modules = list(lora_modules)
        self.lora_requests: dict[str, LoRARequest] = {}  # by name, in the order loaded
        self.last_lora_int_id = 0  # the last loaded's: an unloaded adapter's id stays unused
        self.lock = asyncio.Lock()  # one load or unload at a time

    def static_lora_requests(self) -> list[LoRARequest]:
        """The LoRARequests init_static_loras registers (ids 1, 2, ... in order)."""
        return [
            LoRARequest(m.name, i + 1, m.path, m.base_model_name)
            for i, m in enumerate(self.static_lora_modules)
        ]

    async def init_static_loras(self) -> None:
        """Registers --lora-modules with the engine (lora_int_id 1, 2, ... in order); an
        adapter the engine cannot use is a ValueError naming it: the server does not start."""
        for module in self.static_lora_modules:
            try:
                await self.load_lora_adapter(module.name, module.path, module.base_model_name)
            except OpenAIError as e:
                raise ValueError(f"--lora-modules {module.name}={module.path}: {e.message}") from e

    def resolve(self, model: str | None) -> tuple[str, LoRARequest | None]:
        """The name to answer with and the adapter it names (None for a served model; no
        `model` is the first served one); 404 for a name this server does not serve."""
        if model is None:
            return self.served_model_names[0], None
        if model in self.served_model_names:
            return model, None
        lora_request = self.lora_requests.get(model)
        if lora_request is None:
            served = [*self.served_model_names, *self.lora_requests]
            raise OpenAIError(
                f"The model `{model}` does not exist; this server serves {served}",
                HTTPStatus.NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        return model, lora_request

    def show_available_models(self) -> ModelList:
        """vLLM's cards: a served model's `root` is the model's path; an adapter's is its
        folder, and its `parent` the model it adapts."""
        config = self.engine.config.model_config
        cards = [
            ModelCard(id=name, root=config.model, max_model_len=config.max_model_len)
            for name in self.served_model_names
        ]
        cards += [
            ModelCard(
                id=lora.lora_name,
                root=lora.lora_path,
                parent=lora.base_model_name or self.served_model_names[0],
            )
            for lora in self.lora_requests.values()
        ]
        return ModelList(data=cards)

    async def load_lora_adapter(
        self, lora_name: str, lora_path: str, base_model_name: str | None = None
    ) -> str:
        """Registers the adapter with the engine (which checks it) under the next
        lora_int_id; vLLM's 400s for a missing field, a name in use, or an adapter the
        engine refuses."""
        if not lora_name or not lora_path:
            raise OpenAIError("Both 'lora_name' and 'lora_path' must be provided.")
        async with self.lock:
            self._check_new_name(lora_name)
            lora = LoRARequest(lora_name, self.last_lora_int_id + 1, lora_path, base_model_name)
            try:
                await self.engine.add_lora(lora)
            except (ValueError, TypeError, OSError) as e:
                raise OpenAIError(str(e)) from e
            self.last_lora_int_id = lora.lora_int_id
            self.lora_requests[lora_name] = lora
        logger.info("loaded the LoRA adapter %r from %s", lora_name, lora_path)
        return f"Success: LoRA adapter '{lora_name}' added successfully."

    def _check_new_name(self, lora_name: str) -> None:
        if lora_name in self.lora_requests:
            raise OpenAIError(
                f"The lora adapter '{lora_name}' has already been loaded.", param="lora_name"
            )
        if lora_name in self.served_model_names:
            raise OpenAIError(
                f"The lora adapter name '{lora_name}' is a served model's name; give the "
                "adapter a name of its own.",
                param="lora_name",
            )

    async def unload_lora_adapter(self, lora_name: str) -> str:
        """Forgets the adapter (new requests naming it get 404) and removes it from the
        engine; vLLM's 404 for a name not loaded."""
        async with self.lock:
            lora = self.lora_requests.pop(lora_name, None)
            if lora is None:
                raise OpenAIError(
                    f"The lora adapter '{lora_name}' cannot be found.",
                    HTTPStatus.NOT_FOUND,
                    param="lora_name",
                )
            await self.engine.remove_lora(lora.lora_int_id)
        logger.info("removed the LoRA adapter %r", lora_name)
        return f"Success: LoRA adapter '{lora_name}' removed successfully."
