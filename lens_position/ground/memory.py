"""How much host memory this process can still take, read from the operating system (Linux).

A forward pass that does not fit is killed by the kernel without a word on a CPU (a GPU raises).
The analyses ask this module before a pass whose attention alone is large, so that such a pass is
refused with a message instead (:mod:`lens_position.models.pass_memory`).
"""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")
# cgroup v2 (one file per limit) and v1: the memory limit of the process's container or job
# (a batch scheduler's allocation), below which the kernel kills it whatever the machine has free
CGROUP_V2 = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current"),
             Path("/sys/fs/cgroup/memory.stat"))
CGROUP_V1 = (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
             Path("/sys/fs/cgroup/memory/memory.stat"))
# the page cache a cgroup's usage counts and the kernel can drop when asked for memory (v2, v1)
_CACHE_FIELDS = ("file", "total_cache", "cache")
# a v1 "no limit" is the largest page-aligned signed 64-bit value, or close to it
_NO_LIMIT = 1 << 60


def host_available_bytes(meminfo: Path = MEMINFO,
                         cgroups: tuple[tuple[Path, Path, Path], ...] = (CGROUP_V2, CGROUP_V1)) -> int | None:
    """Bytes of host memory a new allocation can still take, at most: the kernel's ``MemAvailable``
    plus free swap, and no more than the process's cgroup leaves (its limit less its usage, the page
    cache it counts taken as free). None where the system does not say (not Linux, an unreadable or
    unexpected file): then nothing is checked. Generous where unsure: it is read to refuse what
    surely does not fit."""
    fields = _meminfo(meminfo)
    if fields is None or "MemAvailable" not in fields:
        return None
    available = fields["MemAvailable"] + fields.get("SwapFree", 0)
    for limit_file, usage_file, stat_file in cgroups:
        left = _cgroup_left(limit_file, usage_file, stat_file)
        if left is not None:
            return min(available, left)
    return available


def _meminfo(path: Path) -> dict[str, int] | None:
    """``/proc/meminfo``'s fields in bytes (its values are kB), None if unreadable."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def _cgroup_left(limit_file: Path, usage_file: Path, stat_file: Path) -> int | None:
    """What a cgroup's memory limit leaves: its limit less its usage, the page cache in that usage
    counted as free (at least 0); None without a limit."""
    try:
        limit, usage = limit_file.read_text(encoding="ascii").strip(), usage_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not limit.isdigit() or not usage.isdigit() or int(limit) >= _NO_LIMIT:
        return None  # "max" (v2) or the v1 sentinel: no limit
    try:
        stat = dict(line.split()[:2] for line in stat_file.read_text(encoding="ascii").splitlines() if " " in line)
    except (OSError, UnicodeDecodeError, ValueError):
        stat = {}
    cache = next((int(stat[name]) for name in _CACHE_FIELDS if stat.get(name, "").isdigit()), 0)
    return max(int(limit) - int(usage) + cache, 0)
