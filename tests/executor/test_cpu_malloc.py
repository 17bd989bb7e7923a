import mmap
import platform
import subprocess
import sys

import pytest

# Three 20 MiB tensors allocated, filled and freed together, four times; prints the page
# faults of the last three rounds. glibc's defaults map and unmap them every round.
ROUNDS = """
import resource, sys, torch
from pagedllm.executor.cpu_malloc import keep_freed_memory
assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(4):
    if i == 1:
        start = faults()
    parts = [torch.empty(20 << 20, dtype=torch.uint8).fill_(1) for _ in range(3)]
    del parts
print(faults() - start)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc")
def test_freed_activations_are_reused_without_new_page_faults() -> None:
    """Measured in a fresh process: without the settings the rounds fault ~40k pages
    (every round maps its 60 MiB afresh); with them the heap keeps the memory, so at most
    one tensor's pages fault again (a hole the shifting alignment no longer fits)."""
    run = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    pages_per_tensor = (20 << 20) // mmap.PAGESIZE
    assert int(run.stdout) < 2 * pages_per_tensor
