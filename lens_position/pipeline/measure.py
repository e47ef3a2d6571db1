"""Wall time, CPU time and peak resident memory of a block of work."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def _rss_mb() -> float:
    """Resident memory of this process in MB (from /proc where available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def measure(interval_s: float = 0.05) -> Iterator[dict[str, float]]:
    """Wall time (s), CPU time (s, all threads of this process) and peak resident memory (MB)
    of the enclosed block. On a shared machine the CPU time is the steadier measure of cost:
    wall time grows with other processes' load, CPU time much less.

    A background thread samples the resident set every ``interval_s``; the process-wide
    ``ru_maxrss`` bounds it from above where the block set a new process peak.
    """
    stats: dict[str, float] = {}
    peak = [_rss_mb()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            peak[0] = max(peak[0], _rss_mb())

    thread = threading.Thread(target=sample, daemon=True)
    before_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    cpu_start = time.process_time()
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join()
        stats["wall_s"] = time.perf_counter() - start
        stats["cpu_s"] = time.process_time() - cpu_start
        after_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = max(peak[0], _rss_mb())
        if after_max > before_max:  # a new process peak was reached inside the block
            peak_mb = max(peak_mb, after_max / 1024)
        stats["peak_rss_mb"] = peak_mb
