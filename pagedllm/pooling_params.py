"""PoolingParams (vLLM's): what a pooling request asks beyond its prompt."""

from dataclasses import dataclass

from pagedllm.value_checks import as_truncate_prompt_tokens

POOLING_TASKS = ("embed", "classify", "score", "token_classify")
CLASSIFY_TASKS = ("classify", "token_classify")


@dataclass
class PoolingParams:
    """`dimensions`: keep the first `dimensions` values of the pooled vector (Matryoshka
    truncation, before normalising), for models trained for it; `normalize`: None follows
    the model's pooler config, True / False override it for this request;
    `truncate_prompt_tokens` (vLLM's): pool the prompt's last N tokens (-1: max_model_len);
    `use_activation` (vLLM's): a classifier's activation (softmax, sigmoid, ...; False gives
    the score head's raw logits), None follows the model; on an embedding it is
    `normalize`; `task`: vLLM's pooling task ("embed", "classify", "score" or
    "token_classify": a token classifier's labels' scores per token), None the model's
    first (LLM.embed, LLM.classify and LLM.score set it)."""

    dimensions: int | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None:
            if isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int):
                raise TypeError(f"dimensions must be an int, got {self.dimensions!r}")
            if self.dimensions < 1:
                raise ValueError(f"dimensions {self.dimensions} must be >= 1")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool or None, got {self.normalize!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise TypeError(f"use_activation must be a bool or None, got {self.use_activation!r}")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task {self.task!r}: use one of {', '.join(POOLING_TASKS)}")
        self.truncate_prompt_tokens = as_truncate_prompt_tokens(self.truncate_prompt_tokens)

    def verify_task(self, tasks: tuple[str, ...]) -> str:
        """The request's task among the model's `tasks` (its first where unset); the
        embedding's fields on a classifier's task are refused by name."""
        task = self.task or tasks[0]
        if task not in tasks:
            raise ValueError(
                f"task {task!r}: this model's pooling tasks are {', '.join(tasks)}"
                + (" (it is a classifier)" if _classifies(tasks) else "")
            )
        if _classifies(tasks):
            for name in ("dimensions", "normalize"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} is for embeddings; a classifier's output is its labels' "
                        "scores (use_activation turns its activation off)"
                    )
        return task

    def verify(
        self, vector_size: int, is_matryoshka: bool, matryoshka_dimensions: list[int] | None
    ) -> None:
        """The checks that need the model (vLLM's rules); messages start with the field."""
        if self.dimensions is None:
            return
        if not is_matryoshka:
            raise ValueError(
                f"dimensions {self.dimensions}: the model does not support Matryoshka "
                "representation; changing output dimensions would give poor results"
            )
        if matryoshka_dimensions is not None and self.dimensions not in matryoshka_dimensions:
            raise ValueError(
                f"dimensions {self.dimensions} is not one of the model's Matryoshka "
                f"dimensions {matryoshka_dimensions}"
            )
        if self.dimensions > vector_size:
            raise ValueError(
                f"dimensions {self.dimensions} must be in [1, {vector_size}] (the vector's size)"
            )


def _classifies(tasks: tuple[str, ...]) -> bool:
    return any(task in CLASSIFY_TASKS for task in tasks)
