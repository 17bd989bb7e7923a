"""Finding a test's processes: by pid, or by a marker in their environment, so a test can
check that none is left behind without touching anyone else's processes."""

import os
import signal
import time
from pathlib import Path

MARKER_VARIABLE = "TP_MARKER"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def marked_processes(marker: str, grace_s: float = 5.0) -> list[int]:
    """Live processes with `marker` in their environment, once `grace_s` has let those that
    exit with their parent (multiprocessing's resource tracker) go."""
    deadline = time.monotonic() + grace_s
    while True:
        environs = Path("/proc").glob("[0-9]*/environ")
        pids = [int(e.parent.name) for e in environs if marked(e, marker)]
        pids = [pid for pid in pids if alive(pid)]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def marked(environ: Path, marker: str) -> bool:
    try:
        return f"{MARKER_VARIABLE}={marker}".encode() in environ.read_bytes()
    except OSError:  # gone, or not ours
        return False


def gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Whether every process in `pids` has exited within `within_s`."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def stop_marked(marker: str) -> None:
    """SIGTERM the processes carrying `marker`, then SIGKILL those still there after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = marked_processes(marker, grace_s=0)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if gone(pids, within_s=5.0):
            return
