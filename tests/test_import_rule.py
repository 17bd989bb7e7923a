"""Imports flow one way (docs/architecture.md): each top-level unit of pagedllm (a folder or a
module) imports only units below it in LAYERS. Reference: every `import` and `from ... import`
of pagedllm's own code, read with ast, function-level imports included."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[1] / "pagedllm"

LAYERS = (
    ("__init__", "entrypoints"),
    ("benchmarks",),
    ("llm",),
    ("engine",),
    ("core", "executor"),
    ("model_loader", "lora"),
    ("models",),
    ("layers",),
    ("sample", "structured_output", "spec_decode", "forward_context", "distributed"),
    ("_custom_ops",),
    ("_cpu_kernels", "_torch_ops", "_torch_quant", "_triton_ops"),
    ("config", "beam_search", "scoring"),
    (
        "gguf",
        "inputs",
        "sampling_params",
        "pooling_params",
        "pooler_config",
        "classifier_config",
        "checkpoint_quant",
        "sampling_defaults",
        "outputs",
        "cpu_features",
        "cpu_memory",
        "device_copy",
        "tensor_layout",
        "logger",
        "batch_invariant",
        "utils",
    ),
    ("value_checks",),
)
"""Top to bottom; a unit may import the units of any later row, none of its own or above."""

RANK = {unit: len(LAYERS) - i for i, row in enumerate(LAYERS) for unit in row}


def _units() -> set[str]:
    return {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}


def _imports() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, file) for every import of another unit."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "pagedllm" and len(parts) > 1 and parts[1] in RANK:
                    if parts[1] != unit:
                        found.append((unit, parts[1], str(path.relative_to(PACKAGE.parent))))
    return found


def test_every_unit_has_a_layer() -> None:
    assert _units() - {"_C"} <= set(RANK), "place new units in LAYERS"


def test_imports_only_go_down() -> None:
    upward = sorted({(f, unit, dst) for unit, dst, f in _imports() if RANK[dst] >= RANK[unit]})
    assert not upward, "imports of a unit at or above the importer's layer: " + "; ".join(
        f"{f}: {unit} -> {dst}" for f, unit, dst in upward
    )
