"""Every file a document or a docstring names exists: README.md, docs/, and the comments
and docstrings of pagedllm/ and csrc/ cite paths relative to the repository, to pagedllm/,
csrc/, tests/ or docs/, or to the citing file's own folder. Reference: the files on disk."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[1]
BASES = (ROOT, ROOT / "pagedllm", ROOT / "csrc", ROOT / "tests", ROOT / "docs")
CITATION = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)*[\w-]+\.(?:py|c|h|md|inc|toml))\b")
NOT_IN_THE_REPO = {
    "convert_hf_to_gguf.py",  # llama.cpp's converter
    "convert_lora_to_gguf.py",  # llama.cpp's converter of PEFT adapters
    "malloc.h",  # glibc's
    "my_script.py",  # a user's script in an example
}
"""Files cited on purpose that live elsewhere."""


def _citing_files() -> list[pathlib.Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "pagedllm").rglob("*.py")),
        *sorted((ROOT / "csrc").glob("*.[ch]")),
        *sorted((ROOT / "csrc").glob("*.inc")),
    ]


def _exists(citation: str, citing: pathlib.Path) -> bool:
    if citation.startswith("_") and citation.endswith(".c"):
        return (
            True  # a build's suffix after its family's name: `paged_attention_avx512.c`, `_avx2.c`
        )
    candidates = [base / citation for base in (*BASES, citing.parent)]
    return any(c.exists() for c in candidates) or any((ROOT / "pagedllm").rglob(citation))


@pytest.mark.parametrize("citing", _citing_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_files_exist(citing: pathlib.Path) -> None:
    text = citing.read_text()
    text = re.sub(r"#include <[^>]+>", "", text)  # system headers
    missing = {
        c for c in CITATION.findall(text) if c not in NOT_IN_THE_REPO and not _exists(c, citing)
    }
    assert not missing, f"{citing.relative_to(ROOT)} cites files that do not exist: {missing}"
