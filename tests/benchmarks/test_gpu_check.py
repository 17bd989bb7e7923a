"""pagedllm/benchmarks/gpu_check.py (scripts/gpu_check.sh): without a GPU it stops at once
with status 2 and says why; every benchmark phase it would run on a GPU runs here, on the
CPU, with exactly its flags but the device and the sizes, on tiny shapes (a dense one and
a MoE one) whose config.json is all there is; phases are cut at their limit and the deadline.
"""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from pagedllm.benchmarks import gpu_check
from pagedllm.benchmarks.gpu_check import Phase, benchmark_phases, run_phases, summarize
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.sh")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_the_script_fails_fast_without_a_gpu(tmp_path: object) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "gpu_check: no GPU here" in done.stderr and "finds no CUDA GPU" in done.stderr


def test_only_runs_the_phases_it_names(tmp_path: object) -> None:
    phases = gpu_check.all_phases(gpu_check.shape_folders(str(tmp_path)), str(tmp_path))
    chosen = gpu_check.select_phases(phases, ["qwen3-*", "tests-cuda"])
    names = ["qwen3-30b-a3b-latency", "qwen3-30b-a3b-throughput", "tests-cuda"]
    assert [p.name for p in chosen] == names
    assert gpu_check.select_phases(phases, None) == phases
    with pytest.raises(ValueError, match=r"--only llama matches no phase; the phases: tests-tr"):
        gpu_check.select_phases(phases, ["llama"])


def shape_only(model_folder: str, folder: str) -> str:
    """A folder with `model_folder`'s config.json and no weights."""
    os.makedirs(folder)
    shutil.copy(f"{model_folder}/config.json", f"{folder}/config.json")
    return folder


def test_the_check_runs_every_shape_latency_first_and_the_wide_tests_last(
    tmp_path: object,
) -> None:
    phases = gpu_check.all_phases(gpu_check.shape_folders(str(tmp_path)), str(tmp_path))
    names = [p.name for p in phases]
    assert names[0] == "tests-triton" and names[-2:] == ["tests-cuda", "smollm2-lora"]
    shapes = ["smollm2", "llama3-8b", "qwen3-30b-a3b"]
    assert names[1:-2] == [f"{s}-latency" for s in shapes] + [f"{s}-throughput" for s in shapes] + [
        f"{s}-throughput-sync" for s in shapes[:2]
    ] + [f"{s}-latency-torch-rowwise" for s in shapes[:2]]
    torch_rowwise = [p for p in phases if p.name.endswith("-torch-rowwise")]
    assert all(p.env == {"PAGEDLLM_ROWWISE_KERNELS": "torch"} for p in torch_rowwise)
    assert all(not p.env for p in phases if p not in torch_rowwise)
    for shape in shapes[1:]:  # written out; the default model's may be the installed GGUF
        with open(f"{tmp_path}/{shape}/config.json") as f:
            assert json.load(f) == gpu_check.SHAPES[shape]
    benchmarks = [*phases[1:-2], phases[-1]]
    assert all(p.bench_argv[p.bench_argv.index("--device") + 1] == "cuda" for p in benchmarks)


# What the CPU run changes of each benchmark's flags (argparse keeps an option's last value).
SMALLER = {
    "latency": ["--input-len", "4", "--output-len", "3", "--num-iters", "1", "--num-warmup", "0"]
    + ["--bandwidth-mb", "1", "--max-model-len", "64"],
    "throughput": ["--num-prompts", "3", "--input-len", "4", "--output-len", "2:3"]
    + ["--hf-batch-size", "2", "--max-model-len", "64", "--num-warmup-prompts", "1"],
    "lora": ["--num-prompts", "2", "--output-len", "3", "--num-iters", "1", "--lora-rank", "8"]
    + ["--max-model-len", "64"],
}


def test_every_benchmark_phase_runs_on_the_cpu_with_its_flags(
    run_bench: Callable[[list[str]], str],
    tiny_model_path: Callable[[str], str],
    tmp_path: object,
) -> None:
    shapes = {
        "smollm2": shape_only(tiny_model_path(TINY_MODEL), f"{tmp_path}/dense"),
        "llama3-8b": f"{tmp_path}/dense",
        "qwen3-30b-a3b": shape_only(tiny_model_path("qwen3-moe"), f"{tmp_path}/moe"),
    }
    phases = benchmark_phases(shapes, str(tmp_path), device="cpu")
    phases.append(gpu_check.lora_phase(shapes["smollm2"], str(tmp_path), device="cpu"))
    for phase in phases:
        argv = [*phase.bench_argv, *SMALLER[phase.bench_argv[0]], *TINY_ENGINE_FLAGS]
        if "--hf-num-prompts" in argv:
            argv += ["--hf-num-prompts", "2"]
        run_bench(argv)
    records = [{"phase": p.name, "status": "passed"} for p in phases]
    figures = summarize(records, phases)["figures"]
    assert sorted(figures) == sorted(p.name for p in phases)
    moe = figures["qwen3-30b-a3b-latency"]
    assert 0 < moe["percent_of_bound"] and 0 < moe["read_gb_per_step"] and moe["startup_s"] > 0
    assert moe["device_calls_per_step"] > 0  # from --profile
    assert all(f["ratio_to_hf"] > 0 for n, f in figures.items() if n.endswith("-throughput"))
    assert all(f["default_over_sync"] > 0 for n, f in figures.items() if n.endswith("-sync"))
    rowwise = [f for n, f in figures.items() if n.endswith("-torch-rowwise")]
    assert len(rowwise) == 2 and all(f["torch_over_default"] > 0 for f in rowwise)
    with open(f"{tmp_path}/llama3-8b-throughput.json") as f:
        assert "ran the first 2 of the 3 requests" in json.load(f)["results"]["hf"]["detail"]
    lora = figures["smollm2-lora"]["lora_vs_no_lora"]
    assert lora["no LoRA engine, base rows"] == 1 and len(lora) == 4
    lines = gpu_check.format_summary({"figures": figures})
    assert len(lines) == 11 and "% of the bound" in lines[0] and "kernels a step" in lines[0]
    assert "x transformers" in lines[5] and "async scheduling (the default)" in lines[7]
    assert "x the Triton row-wise kernels' time" in lines[-2]
    assert lines[-1].startswith("smollm2-lora: against no LoRA: no LoRA engine, base rows 1.00x")


def test_phases_are_cut_at_their_limit_and_at_the_deadline(tmp_path: object) -> None:
    phases = [
        Phase("ok", 30, ["-c", "print('hello')"]),
        Phase("fails", 30, ["-c", "raise SystemExit(3)"]),
        Phase("slow", 1, ["-c", "import time; time.sleep(30)"]),
        Phase("late", 30, ["-c", "pass"]),
    ]
    records = run_phases(phases, str(tmp_path), deadline_s=21.0, python=sys.executable)
    assert [r["status"] for r in records] == ["passed", "failed (exit 3)", "cut at 1 s", "skipped"]
    assert open(f"{tmp_path}/ok.log").read() == "hello\n"


def test_tests_needing_a_package_the_machine_lacks_are_left_out(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Directly, through a tests module, or (a conftest.py) with their whole folder."""
    root = pathlib.Path(str(tmp_path))
    files = {
        "tests/helper.py": "import json\nimport absent_client\n",
        "tests/test_plain.py": "import os\nimport torch\nfrom pagedllm import LLM\n",
        "tests/test_direct.py": "from absent_client.types import X\n",
        "tests/test_through_helper.py": "from tests.helper import thing\n",
        "tests/test_lazy.py": "def test_x():\n    import absent_client\n",
        "tests/server/conftest.py": "import absent_client\n",
        "tests/server/test_any.py": "import os\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "absent_client" else real(n, *a)
    )
    gpu_check._lacks_a_package.cache_clear()
    found = gpu_check.unimportable_tests(root)
    expected = ["tests/server", "tests/test_direct.py", "tests/test_through_helper.py"]
    assert found == [str(root / name) for name in expected]
    phases = gpu_check.all_phases({}, str(root), str(root))
    assert all(f"--ignore={root / 'tests/server'}" in p.argv for p in (phases[0], phases[-1]))


def test_main_runs_the_phases_and_writes_the_summary(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """With a GPU (faked here) the check runs its phases from the tree's root and writes
    summary.json; a failed phase makes its status 1."""
    monkeypatch.setattr(gpu_check, "gpu_description", lambda: "a fake GPU")
    report = {"benchmark": "latency", "bandwidth_bytes_per_s": 4e12, "read_bytes_per_step": 16e9}
    report["results"] = {"pagedllm": {"tpot_s": {"mean": 0.005}, "percent_of_bound": 80.0}}
    report["results"]["pagedllm"]["startup_s"] = 9.0
    written = f"{tmp_path}/l.json"
    script = f"import json; json.dump({report!r}, open({written!r}, 'w'))"
    phases = [Phase("writes", 30, ["-c", script], written), Phase("fails", 30, ["-c", "1/0"])]
    monkeypatch.setattr(gpu_check, "all_phases", lambda shapes, out, root: phases)
    monkeypatch.chdir(str(tmp_path))
    assert gpu_check.main([f"{tmp_path}/out", "--deadline", "100"]) == 1
    summary = json.load(open(f"{tmp_path}/out/summary.json"))
    assert summary["gpu"] == "a fake GPU"
    assert summary["packages"]["torch"] == importlib.metadata.version("torch")
    assert summary["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert [r["status"] for r in summary["phases"]] == ["passed", "failed (exit 1)"]
    assert summary["figures"]["writes"]["decode_ms_per_step"] == pytest.approx(5.0)
    out = capsys.readouterr()
    assert "writes: 5.00 ms a step, 80.0% of the bound" in out.out
    assert f"gpu_check: torch {summary['packages']['torch']}, triton " in out.out
    assert "not passed: fails" in out.err
