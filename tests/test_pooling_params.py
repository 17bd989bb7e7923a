"""pooling_params.py: PoolingParams' checks, with vLLM's Matryoshka rule (dimensions only
for models whose config says Matryoshka, within its listed sizes and the hidden size)."""

import pytest

from pagedllm.pooling_params import PoolingParams


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (True, TypeError), (2.0, TypeError)])
def test_bad_dimensions(value: object, error: type) -> None:
    with pytest.raises(error, match="dimensions"):
        PoolingParams(dimensions=value)


def test_matryoshka_rule() -> None:
    PoolingParams().verify(64, False, None)
    PoolingParams(dimensions=64).verify(64, True, None)
    with pytest.raises(ValueError, match="^dimensions 8: .*Matryoshka"):
        PoolingParams(dimensions=8).verify(64, False, None)
    with pytest.raises(ValueError, match=r"^dimensions 65 must be in \[1, 64\]"):
        PoolingParams(dimensions=65).verify(64, True, None)
    with pytest.raises(ValueError, match=r"not one of .* \[32, 16\]"):
        PoolingParams(dimensions=8).verify(64, True, [32, 16])


def test_task_and_use_activation_are_checked() -> None:
    with pytest.raises(ValueError, match="task 'rank': use one of embed, classify, score"):
        PoolingParams(task="rank")
    with pytest.raises(TypeError, match="use_activation must be a bool"):
        PoolingParams(use_activation=1)


def test_verify_task_takes_the_models_first_task_and_refuses_others() -> None:
    assert PoolingParams().verify_task(("classify", "score")) == "classify"
    assert PoolingParams(task="score").verify_task(("embed", "score")) == "score"
    with pytest.raises(ValueError, match="task 'embed': .* classify, score .*classifier"):
        PoolingParams(task="embed").verify_task(("classify", "score"))
    with pytest.raises(ValueError, match="normalize is for embeddings"):
        PoolingParams(normalize=True).verify_task(("classify", "score"))
