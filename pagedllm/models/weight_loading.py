"""Map checkpoint tensors onto a model's (possibly fused) parameters.

A model declares how checkpoint names fold into its parameters: stacked mappings
(`("qkv_proj", "q_proj", "q")` folds `q_proj` into shard "q" of `qkv_proj`) and, for MoE,
expert mappings from FusedMoE.make_expert_params_mapping. Every checkpoint tensor must
land somewhere and every parameter must be loaded, or loading fails naming them.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from pagedllm.layers.fused_moe import FusedMoE
from pagedllm.layers.parameter import default_weight_loader


@dataclass(frozen=True)
class WeightsMapper:
    """vLLM's WeightsMapper: a checkpoint name has each key of `orig_to_new_substr` it holds
    replaced by its value (Mixtral's `.block_sparse_moe.` -> `.mlp.`), then a key of
    `orig_to_new_prefix` it starts with replaced by its value, or is dropped where that value
    is None (a part of the checkpoint the model does not run)."""

    orig_to_new_prefix: dict[str, str | None] = field(default_factory=dict)
    orig_to_new_substr: dict[str, str] = field(default_factory=dict)

    def map_name(self, name: str) -> str | None:
        for old, new in self.orig_to_new_substr.items():
            name = name.replace(old, new)
        for old, new in self.orig_to_new_prefix.items():
            if name.startswith(old):
                return None if new is None else new + name[len(old) :]
        return name

    def checkpoint_names(self, name: str) -> list[str]:
        """The checkpoint names that map to model name `name` (map_name's inverse): the
        renames' sources first, then `name` itself where no rename takes it."""
        renamed = name
        for old, new in self.orig_to_new_substr.items():
            renamed = renamed.replace(new, old)
        names = [
            old + stem[len(new) :]
            for stem in dict.fromkeys((renamed, name))
            for old, new in self.orig_to_new_prefix.items()
            if new is not None and stem.startswith(new)
        ]
        candidates = dict.fromkeys([*names, renamed, name])
        return [n for n in candidates if self.map_name(n) == name]

    def keep(self, keep: Callable[[str], bool]) -> Callable[[str], bool]:
        """`keep` (a filter of the model's names) as a filter of the checkpoint's."""

        def mapped(name: str) -> bool:
            new = self.map_name(name)
            return new is not None and keep(new)

        return mapped

    def apply(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            new = self.map_name(name)
            if new is not None:
                yield new, tensor


NESTED_LANGUAGE_MODEL = WeightsMapper(
    {
        "language_model.model.": "model.",
        "language_model.lm_head.": "lm_head.",
        "model.language_model.": "model.",
        "vision_tower.": None,
        "multi_modal_projector.": None,
        "model.vision_tower.": None,
        "model.multi_modal_projector.": None,
    }
)
"""The language model of an image-and-text checkpoint (Gemma 3's, Mistral 3's) run alone:
its tensors under transformers' older `language_model.model.` / `language_model.lm_head.`
or newer `model.language_model.` / `lm_head.` names are the text model's; the vision tower
and projector are never read. A text-only checkpoint has none of these prefixes."""


StackedMapping = list[tuple[str, str, object]]
ExpertMapping = list[tuple[str, str, int, str]]


def load_named_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params_mapping: StackedMapping = (),
    expert_params_mapping: ExpertMapping = (),
    skip_prefixes: tuple[str, ...] = (),
) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: dict[str, set[tuple]] = {}
    for name, tensor in weights:
        if name.startswith(skip_prefixes) or name.endswith("rotary_emb.inv_freq"):
            continue
        if _unused_zero_bias(name, tensor, params, stacked_params_mapping):
            continue
        param_name, args = _resolve(name, params, stacked_params_mapping, expert_params_mapping)
        param = params[param_name]
        loader = getattr(param, "weight_loader", default_weight_loader)
        try:
            loader(param, tensor, *args)
        except ValueError as e:
            raise ValueError(f"cannot load checkpoint tensor {name!r}: {e}") from e
        loaded.setdefault(param_name, set()).add(args)
    _check_all_loaded(model, params, loaded, stacked_params_mapping, expert_params_mapping)


def _unused_zero_bias(
    name: str, tensor: torch.Tensor, params: dict[str, nn.Parameter], stacked: StackedMapping
) -> bool:
    """A bias of zeros for a layer that has none: AutoGPTQ writes them for every quantized
    layer; vLLM skips such extra biases, and a zero bias changes nothing."""
    if not name.endswith(".bias") or name in params:
        return False
    fused = [name.replace(w, p) for p, w, _ in stacked if w in name]
    return not any(candidate in params for candidate in fused) and not tensor.any()


def _resolve(
    name: str,
    params: dict[str, nn.Parameter],
    stacked: StackedMapping,
    experts: ExpertMapping,
) -> tuple[str, tuple]:
    """The parameter a checkpoint name loads into, and the extra loader arguments."""
    for param_part, weight_part, expert_id, shard_id in experts:
        if weight_part in name:
            candidate = name.replace(weight_part, param_part)
            if candidate in params:
                return candidate, (shard_id, expert_id)
    for param_part, weight_part, shard_id in stacked:
        if weight_part in name:
            candidate = name.replace(weight_part, param_part)
            if candidate in params:
                return candidate, (shard_id,)
    if name in params:
        return name, ()
    raise ValueError(f"checkpoint tensor {name!r} matches no parameter of the model")


def _expected_shards(
    model: nn.Module, name: str, stacked: StackedMapping, experts: ExpertMapping
) -> set[tuple]:
    """The loads parameter `name` needs: each of its stacked shards, or each (shard, expert)
    of the experts its FusedMoE holds (under expert parallelism, this rank's only)."""
    module = model.get_submodule(name.rpartition(".")[0])
    held = module.local_experts if isinstance(module, FusedMoE) else None
    expected = {
        (shard_id, expert_id)
        for part, _, expert_id, shard_id in experts
        if part in name and (held is None or expert_id in held)
    }
    expected |= {(shard_id,) for part, _, shard_id in stacked if part in name}
    return expected or {()}


def _check_all_loaded(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    loaded: dict[str, set[tuple]],
    stacked: StackedMapping,
    experts: ExpertMapping,
) -> None:
    """Every shard of every parameter must be loaded; tied parameters share their loads."""
    by_id: dict[int, set[tuple]] = {}
    for name, shards in loaded.items():
        by_id.setdefault(id(params[name]), set()).update(shards)
    missing = []
    for name, param in model.named_parameters():
        absent = _expected_shards(model, name, stacked, experts) - by_id.get(id(param), set())
        missing += [f"{name}{list(shard) if shard else ''}" for shard in sorted(absent, key=str)]
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ValueError(f"checkpoint has no weights for {len(missing)} parameters: {shown}")
