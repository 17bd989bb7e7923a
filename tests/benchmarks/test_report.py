"""`pagedllm bench report` (pagedllm/benchmarks/report.py). Reference: the report names the
machine and, per table, its title, the exact command and what that command printed when run
alone; --only selects tables; vLLM's rows come only with --vllm-python."""

import pytest

from pagedllm.benchmarks import report
from tests.benchmarks.conftest import TINY_ENGINE_FLAGS, TINY_MODEL


def _tiny_tables(model: str) -> tuple[report.Table, ...]:
    flags = " ".join(["--model", model, *TINY_ENGINE_FLAGS])
    return (
        report.Table(
            "Batch 1 on the tiny model",
            f"latency --batch-size 1 --input-len 8 --output-len 4 --num-iters 1 {flags}",
        ),
        report.Table(
            "Throughput on the tiny model",
            f"throughput --num-prompts 3 --input-len 8 --output-len 4 --backend pagedllm {flags}",
        ),
    )


def test_the_report_runs_each_table_and_prints_its_command_and_result(
    run_bench, tiny_model_path, monkeypatch
) -> None:
    tables = _tiny_tables(tiny_model_path(TINY_MODEL))
    monkeypatch.setattr(report, "TABLES", tables)
    text = run_bench(["report"])
    assert text.startswith("# pagedllm benchmark report")
    assert "Machine: " in text and "threads" in text and "torch " in text
    for table in tables:
        assert f"## {table.title}" in text
        assert f"$ pagedllm bench {table.command}" in text
    assert "TTFT ms" in text and "pagedllm" in text.split("## Throughput")[1]


def test_only_selects_tables_and_output_writes_a_file(
    run_bench, tiny_model_path, monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(report, "TABLES", _tiny_tables(tiny_model_path(TINY_MODEL)))
    path = tmp_path / "report.md"
    assert run_bench(["report", "--only", "throughput", "--output", str(path)]) == ""
    text = path.read_text()
    assert "## Throughput on the tiny model" in text and "## Batch 1" not in text


@pytest.mark.parametrize("vllm_python", [None, "/venv/bin/python"])
def test_vllm_joins_only_with_its_python(vllm_python, monkeypatch) -> None:
    monkeypatch.setattr(report, "hf_folder_path", lambda gguf: "/cache/model.hf")
    bf16 = next(t for t in report.TABLES if "{vllm}" in t.command)
    argv = report.command_of(bf16, vllm_python)
    assert "/cache/model.hf" in argv
    backends = argv[argv.index("--backend") + 1]
    if vllm_python:
        assert backends == "pagedllm,vllm" and argv[-2:] == ["--vllm-python", vllm_python]
    else:
        assert backends == "pagedllm" and "--vllm-python" not in argv
