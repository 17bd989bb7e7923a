"""Logits processors: BatchUpdate bookkeeping as vLLM v1, built-ins against transformers'
MinPLogitsWarper and direct formulas, and the loader."""

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper

from pagedllm.sample.logits_processors import (
    BatchUpdate,
    LogitBiasLogitsProcessor,
    LogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
    MoveDirectionality,
    build_logitsprocs,
    load_logits_processors,
    process_dict_updates,
)
from pagedllm.sampling_params import SamplingParams

CPU = torch.device("cpu")


def added(*params: SamplingParams, outputs: list[list[int]] | None = None) -> BatchUpdate:
    outputs = outputs or [[] for _ in params]
    rows = [(i, p, [], out) for i, (p, out) in enumerate(zip(params, outputs, strict=True))]
    return BatchUpdate(batch_size=len(params), removed=[], added=rows, moved=[])


def test_process_dict_updates_add_remove_move_swap() -> None:
    """Reference: vLLM's process_dict_updates (added, then removed, then moved)."""
    entries: dict[int, float] = {}
    state = lambda p, _prompt, _out: p.min_p or None  # noqa: E731
    ps = [SamplingParams(min_p=0.1 * (i + 1)) for i in range(3)]
    assert process_dict_updates(entries, added(*ps), state)
    assert entries == pytest.approx({0: 0.1, 1: 0.2, 2: 0.3})
    swap = (0, 2, MoveDirectionality.SWAP)
    update = BatchUpdate(3, removed=[1], added=[], moved=[swap])
    assert process_dict_updates(entries, update, state)
    assert entries == pytest.approx({0: 0.3, 2: 0.1})
    move = (2, 1, MoveDirectionality.UNIDIRECTIONAL)
    process_dict_updates(entries, BatchUpdate(2, removed=[], added=[], moved=[move]), state)
    assert entries == pytest.approx({0: 0.3, 1: 0.1})
    off = BatchUpdate(2, removed=[], added=[(0, SamplingParams(), [], [])], moved=[])
    assert process_dict_updates(entries, off, state) and entries == pytest.approx({1: 0.1})
    assert not process_dict_updates(entries, None, state)


def test_min_p_equals_transformers_min_p_warper_and_follows_batch_size() -> None:
    logits = torch.randn(3, 50) * 3
    proc = MinPLogitsProcessor(50, CPU)
    proc.update_state(added(SamplingParams(min_p=0.2), SamplingParams(), SamplingParams(min_p=0.6)))
    assert proc.is_argmax_invariant()
    ours = proc.apply(logits.clone())
    for i, min_p in [(0, 0.2), (2, 0.6)]:
        torch.testing.assert_close(ours[i], MinPLogitsWarper(min_p)(None, logits[i : i + 1])[0])
    torch.testing.assert_close(ours[1], logits[1])
    proc.update_state(BatchUpdate(1, removed=[1, 2], added=[], moved=[]))
    assert proc.apply(logits[:1].clone()).shape == (1, 50)


def test_logit_bias_adds_bias_per_row() -> None:
    logits = torch.randn(2, 8)
    proc = LogitBiasLogitsProcessor(8, CPU)
    proc.update_state(added(SamplingParams(), SamplingParams(logit_bias={3: 5.0, 7: -2.5})))
    expected = logits.clone()
    expected[1, 3] += 5.0
    expected[1, 7] -= 2.5
    torch.testing.assert_close(proc.apply(logits.clone()), expected)
    assert not proc.is_argmax_invariant()


def test_min_tokens_bans_stop_ids_and_eos_until_reached() -> None:
    params = SamplingParams(min_tokens=2, stop_token_ids=[4])
    params.update_from_generation_config({}, model_eos_token_id=1)
    output: list[int] = [6]
    proc = MinTokensLogitsProcessor(8, CPU)
    proc.update_state(added(SamplingParams(), params, outputs=[[], output]))
    banned = proc.apply(torch.zeros(2, 8)).isinf()
    assert banned.nonzero().tolist() == [[1, 1], [1, 4]]
    output.append(5)
    proc.update_state(None)
    assert not proc.apply(torch.zeros(2, 8)).isinf().any()


class Forbid(LogitsProcessor):
    """A custom processor: bans token extra_args["forbid"] in the rows that set it."""

    def __init__(self, vocab_size: int, device: torch.device, is_pin_memory: bool = False) -> None:
        super().__init__(vocab_size, device, is_pin_memory)
        self.forbid: dict[int, int] = {}

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        forbid = (params.extra_args or {}).get("forbid", 0)
        if not isinstance(forbid, int):
            raise ValueError(f"extra_args['forbid'] must be a token id, got {forbid!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        state = lambda p, _prompt, _out: (p.extra_args or {}).get("forbid")  # noqa: E731
        process_dict_updates(self.forbid, batch_update, state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token in self.forbid.items():
            logits[row, token] = float("-inf")
        return logits


def test_loader_accepts_classes_and_module_strings() -> None:
    spec = f"{__name__}:Forbid"
    assert load_logits_processors([Forbid, spec, f"{__name__}.Forbid"]) == [Forbid] * 3


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("Forbid", "module:Class"),
        ("no_such_module_xyz:Thing", "cannot load"),
        (f"{__name__}:Missing", "cannot load"),
        (f"{__name__}:added", "subclass of LogitsProcessor"),
        (int, "subclass of LogitsProcessor"),
    ],
)
def test_loader_errors_name_the_spec(spec: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_logits_processors([spec])


def test_build_orders_builtins_then_custom_and_validates() -> None:
    procs = build_logitsprocs(8, CPU, custom=[Forbid])
    kinds = [type(p) for p in procs.all]
    assert kinds == [
        MinTokensLogitsProcessor,
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        Forbid,
    ]
    assert [type(p) for p in procs.argmax_invariant] == [MinPLogitsProcessor]
    with pytest.raises(ValueError, match="forbid"):
        procs.validate_params(SamplingParams(extra_args={"forbid": "x"}))
