"""This process's resident and anonymous memory (Linux ``/proc``), and their peaks over a block,
sampled in a thread: what the memory benchmarks report."""

from __future__ import annotations

import threading
import time

_PAGE_KIB = 4


def anonymous_mib() -> float:
    """This process's anonymous resident memory (RssAnon), MiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def resident_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE_KIB / 1024


class Peaks:
    """The highest resident and anonymous memory seen, sampled every 5 ms in a thread."""

    def __init__(self) -> None:
        self.resident, self.anonymous, self._stop = 0.0, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.resident = max(self.resident, resident_mib())
            self.anonymous = max(self.anonymous, anonymous_mib())
            time.sleep(0.005)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.resident = max(self.resident, resident_mib())
        self.anonymous = max(self.anonymous, anonymous_mib())
