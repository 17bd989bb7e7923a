"""pagedllm/entrypoints/sampling_args.py: the sampling flags of `generate` and `chat`.
Reference: SamplingParams itself: each flag is named after its field and lands in it, so the
flags build the object SamplingParams(...) builds from the same values."""

import argparse
import dataclasses

import pytest

from pagedllm.entrypoints.sampling_args import add_sampling_args, sampling_params_from_args
from pagedllm.sampling_params import REQUEST_FIELDS, RequestOutputKind, SamplingParams

FLAGS = [
    "--max-tokens",
    "7",
    "--temperature",
    "0.7",
    "--top-p",
    "0.9",
    "--top-k",
    "5",
    "--min-p",
    "0.1",
    "--repetition-penalty",
    "1.2",
    "--presence-penalty",
    "0.5",
    "--frequency-penalty",
    "-0.5",
    "--seed",
    "42",
    "--stop",
    "x",
    "--stop",
    "yz",
    "--ignore-eos",
]
VALUES = dict(
    max_tokens=7,
    temperature=0.7,
    top_p=0.9,
    top_k=5,
    min_p=0.1,
    repetition_penalty=1.2,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    seed=42,
    stop=["x", "yz"],
    ignore_eos=True,
)


def parser(max_tokens: int = 256) -> argparse.ArgumentParser:
    result = argparse.ArgumentParser()
    add_sampling_args(result, max_tokens=max_tokens)
    return result


def sampling_dests() -> list[str]:
    (group,) = [g for g in parser()._action_groups if g.title == "sampling"]
    return [action.dest for action in group._group_actions]


def test_every_flag_is_a_field_the_builder_passes() -> None:
    """A flag outside REQUEST_FIELDS (and not max_tokens) would be silently dropped."""
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    for dest in sampling_dests():
        assert dest in fields, dest
        assert dest in REQUEST_FIELDS or dest == "max_tokens", dest
    assert set(sampling_dests()) == set(VALUES)


def test_each_flag_lands_in_its_field() -> None:
    defaults = SamplingParams()
    assert all(getattr(defaults, name) != value for name, value in VALUES.items())
    params = sampling_params_from_args(parser().parse_args(FLAGS))
    assert params == SamplingParams(**VALUES)


def test_defaults_are_sampling_params_but_greedy() -> None:
    """Without flags: SamplingParams' defaults, except greedy (temperature 0) and the
    command's max_tokens."""
    params = sampling_params_from_args(parser(max_tokens=512).parse_args([]))
    assert params == SamplingParams(max_tokens=512, temperature=0.0)


def test_overrides_pass_through_and_other_namespace_entries_are_ignored() -> None:
    args = parser().parse_args(["--top-k", "3", "--temperature", "0.5"])
    args.tensor_parallel_size = 2  # an engine flag living in the same namespace
    params = sampling_params_from_args(args, output_kind=RequestOutputKind.DELTA)
    assert params.output_kind is RequestOutputKind.DELTA and params.top_k == 3
    assert params == SamplingParams(
        max_tokens=256, temperature=0.5, top_k=3, output_kind=RequestOutputKind.DELTA
    )


def test_bad_values_fail_with_sampling_params_message() -> None:
    with pytest.raises(ValueError, match="top_p must be in"):
        sampling_params_from_args(parser().parse_args(["--top-p", "1.5"]))
