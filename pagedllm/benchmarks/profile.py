"""`--profile`: where a benchmark's time goes, as torch.profiler's top ops.

One extra run (after the timed ones, so it does not slow them) is recorded with the CPU and,
on a GPU, CUDA activities. The summary lists the ops with the most self time on the device
(the CPU's when there is no GPU), and how busy the device was over the run's wall time: a
share well under 1 means the host (Python, launches, scheduling) is on the critical path.
On a GPU only the device's own rows count (kernels, copies, memsets), as in torch's own
table: the CPU op or runtime call that launched a kernel reports that kernel's time as its
self device time too, and a user annotation on the device spans the kernels inside it.
"""

import time
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _self_time(event: object, device: bool) -> float:
    """Self microseconds of a key_averages() row on the device (or the CPU); 0 for a row
    whose device time is another row's (the module docstring)."""
    if not device:
        return event.self_cpu_time_total
    on_cpu = event.device_type == DeviceType.CPU
    legacy = getattr(event, "is_legacy", False)  # read as older torch may lack it
    if (on_cpu and not legacy) or getattr(event, "is_user_annotation", False):
        return 0.0
    return getattr(event, "self_device_time_total", None) or getattr(
        event, "self_cuda_time_total", 0.0
    )


def profile_summary(run: Callable[[], object], top: int = 25) -> dict:
    """Runs `run` once under torch.profiler -> {"device", "wall_us", "busy_us",
    "busy_share", "calls": how many ops (on a GPU: kernels, copies, memsets) ran, "ops": the
    `top` ops by self time: name, calls, self_us, share}. On a GPU, calls over a decode
    run's steps is the kernels a step launches, what a step's small kernels cost."""
    device = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run()
        if device:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    events = [e for e in prof.key_averages() if _self_time(e, device) > 0]
    events.sort(key=lambda e: _self_time(e, device), reverse=True)
    busy = sum(_self_time(e, device) for e in events)
    return {
        "device": "cuda" if device else "cpu",
        "wall_us": wall_us,
        "busy_us": busy,
        "busy_share": busy / wall_us if wall_us else 0.0,
        "calls": sum(e.count for e in events),
        "ops": [
            {
                "name": e.key,
                "calls": e.count,
                "self_us": _self_time(e, device),
                "share": _self_time(e, device) / busy,
            }
            for e in events[:top]
        ],
    }


def format_profile(summary: dict, top: int = 10) -> list[str]:
    """The summary's first `top` ops as text lines."""
    lines = [
        f"profile ({summary['device']} self time): busy {summary['busy_us'] / 1e3:.1f} ms of "
        f"{summary['wall_us'] / 1e3:.1f} ms wall ({100 * summary['busy_share']:.0f}%), "
        f"{summary['calls']} calls"
    ]
    for op in summary["ops"][:top]:
        lines.append(
            f"  {100 * op['share']:5.1f}%  {op['self_us'] / 1e3:9.2f} ms  "
            f"{op['calls']:>7d} calls  {op['name'][:80]}"
        )
    return lines
