"""PoolingParams (vLLM's): what a pooling request asks beyond its prompt."""

from dataclasses import dataclass

from pagedllm.value_checks import as_truncate_prompt_tokens


@dataclass
class PoolingParams:
    """`dimensions`: keep the first `dimensions` values of the pooled vector (Matryoshka
    truncation, before normalising), for models trained for it; `normalize`: None follows
    the model's pooler config, True / False override it for this request;
    `truncate_prompt_tokens` (vLLM's): pool the prompt's last N tokens (-1: max_model_len)."""

    dimensions: int | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None:
            if isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int):
                raise TypeError(f"dimensions must be an int, got {self.dimensions!r}")
            if self.dimensions < 1:
                raise ValueError(f"dimensions {self.dimensions} must be >= 1")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool or None, got {self.normalize!r}")
        self.truncate_prompt_tokens = as_truncate_prompt_tokens(self.truncate_prompt_tokens)

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
