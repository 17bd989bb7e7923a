"""What /proc says about this process's memory: resident bytes, and a mapping's flags."""

import mmap


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def mapping_of(address: int) -> tuple[str, str]:
    """(permissions, VmFlags) of the mapping in /proc/self/smaps that holds address."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found = fields[1] if start <= address < end else None
            elif found is not None and fields[0] == "VmFlags:":
                return found, line
    raise AssertionError(f"{address:#x} is in no mapping")
