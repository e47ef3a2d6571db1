"""Headless Chromium with the network switched off: the one set of flags every browser the
package starts is given (the report's browser check and kaleido's figure export).

The pages it renders are local files with their scripts inlined or beside them, so Chromium needs
no network; :data:`NETWORK_OFF` stops what it would send by itself (DNS prefetch, component and
safe-browsing updates, metrics, field trials, sync, WebRTC's STUN packets, pings): every proxied
request goes to a closed port on the loopback, every host name resolves to nothing, and loopback
itself bypasses nothing. A test runs both browsers in a network namespace and counts the packets
that leave it for a non-loopback address: none.
"""

from __future__ import annotations

import shutil
from typing import Any

from lens_position.ground.errors import MissingPackageError

NETWORK_OFF = ("--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-domain-reliability", "--dns-prefetch-disable", "--no-pings", "--disable-breakpad",
               "--disable-client-side-phishing-detection", "--disable-default-apps", "--disable-field-trial-config",
               "--metrics-recording-only", "--no-default-browser-check", "--disable-features=OptimizationHints,"
               "MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,CertificateTransparencyComponentUpdater,"
               "Translate,InterestFeedContentSuggestions,NetworkTimeServiceQuerying,WebRtcHideLocalIpsWithMdns",
               "--force-webrtc-ip-handling-policy=disable_non_proxied_udp", "--disable-quic",
               "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1")


def find_chromium() -> str:
    """Path of a Chromium/Chrome binary, or MissingPackageError saying how to install one."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise MissingPackageError(
        "no Chromium found for the report's browser check: install it with "
        "`apt-get install -y chromium` (scripts/setup.sh does this when run as root)"
    )


def kaleido_options() -> dict[str, Any]:
    """What ``kaleido.Kaleido(**options)`` needs to render a figure without a network: its
    Chromium started with :data:`NETWORK_OFF` (choreographer takes no extra flags, so a subclass
    adds them to its command line), MathJax off (kaleido's default loads it from a CDN; the
    package's figures have no LaTeX) and plotly.js from the installed ``plotly`` package."""
    from pathlib import Path

    import plotly
    from choreographer.browsers.chromium import Chromium

    class NetworkOffChromium(Chromium):
        def get_cli(self) -> list[str]:
            return [*super().get_cli(), *NETWORK_OFF]

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return {"browser_cls": NetworkOffChromium, "mathjax": False, "plotlyjs": str(plotly_js)}
