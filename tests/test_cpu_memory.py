"""pagedllm/cpu_memory.py: anonymous maps are private zeros that ask for huge pages or not, as
told (the VmFlags /proc/self/smaps shows); the THP mode and page size are read from sysfs."""

import pathlib

import pytest
import torch

from pagedllm import cpu_memory
from pagedllm.cpu_memory import anonymous_map, huge_page_map, huge_page_size
from tests.memory_maps import mapping_of

needs_thp = pytest.mark.skipif(huge_page_size() is None, reason="no transparent huge pages")


@pytest.mark.parametrize(
    ("enabled", "expected"),
    [
        ("always [madvise] never", 2 << 20),
        ("[always] madvise never", 2 << 20),
        ("always madvise [never]", None),
    ],
)
def test_huge_page_size_follows_the_thp_mode(tmp_path, monkeypatch, enabled, expected) -> None:
    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "hpage_pmd_size").write_text(f"{2 << 20}\n")
    monkeypatch.setattr(cpu_memory, "THP_SYSFS", tmp_path)
    assert huge_page_size() == expected


def test_huge_page_size_is_none_without_thp(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cpu_memory, "THP_SYSFS", tmp_path / "missing")
    assert huge_page_size() is None


def test_anonymous_map_is_zeros_of_the_size_asked() -> None:
    memory = anonymous_map(3 * 4096 + 5, huge_pages=False)
    assert memory.dtype == torch.uint8 and memory.numel() == 3 * 4096 + 5
    assert memory.count_nonzero() == 0
    memory[-1] = 7
    assert memory.count_nonzero() == 1


@needs_thp
@pytest.mark.skipif(not pathlib.Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(("huge_pages", "flag"), [(True, " hg"), (False, " nh")])
def test_maps_ask_for_huge_pages_or_not(huge_pages, flag) -> None:
    memory = anonymous_map(4 << 20, huge_pages)
    permissions, flags = mapping_of(memory.data_ptr())
    assert permissions == "rw-p" and flag in flags


def test_huge_page_map_starts_on_a_page_and_has_the_size_asked() -> None:
    """Any page size (the advice is a request): the bytes start on a page boundary, zero."""
    page = 2 << 20
    memory = huge_page_map(3 * page + 5, page)
    assert memory.dtype == torch.uint8 and memory.numel() == 3 * page + 5
    assert memory.data_ptr() % page == 0 and memory.count_nonzero() == 0
