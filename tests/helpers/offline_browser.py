"""Open a local HTML file in headless Chromium with the network switched off; return the DOM.

Every host resolves to nothing and every request goes to a dead proxy, so anything a page tries
to fetch from a CDN fails, as on a machine without a network. ``file://`` pages and the files
beside them still load. Used by the offline-rendering tests of the docs and the notebooks.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from lens_position.report.html import NETWORK_OFF, find_chromium


def dump_dom_offline(page: Path, *, budget_ms: int = 30000, timeout_s: float = 180.0) -> str:
    """The DOM of ``page`` after its scripts ran (``--virtual-time-budget``), without a network."""
    binary = find_chromium()
    with tempfile.TemporaryDirectory(prefix="lens-position-offline-") as profile:
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                *NETWORK_OFF, f"--virtual-time-budget={budget_ms}", "--dump-dom", Path(page).resolve().as_uri()]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    assert proc.stdout, f"Chromium printed no DOM for {page}:\n{proc.stderr[-2000:]}"
    return proc.stdout
