"""MkDocs hook: serve MathJax from an installed package, so every equation renders offline.

The equations are TeX between ``\\(`` ``\\)`` and ``\\[`` ``\\]`` (``pymdownx.arithmatex``) and MathJax 3
typesets them in the browser. Its script comes from the PyPI package ``django-static-mathjax``
(MathJax 3.2.2's own distribution files, no dependencies), copied into the built site at
``javascripts/vendor/mathjax/tex-svg.js``: no CDN, so a site opened from disk without a network
shows equations, not raw TeX. ``tex-svg.js`` rather than the CommonHTML build because SVG output
needs no font files beside the script: one file to vendor.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SITE_PATH = "javascripts/vendor/mathjax/tex-svg.js"


def mathjax_script() -> Path:
    """The installed MathJax 3 single-file SVG build (a PluginError saying what to install if absent)."""
    spec = find_spec("mathjax")
    script = (Path(spec.origin).parent / "static" / "mathjax" / "es5" / "tex-svg.js") if spec and spec.origin else None
    if script is None or not script.is_file():
        raise PluginError("MathJax for the docs' equations is missing: pip install django-static-mathjax "
                          "(in the dev extra: pip install -e '.[dev]')")
    return script


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, SITE_PATH, abs_src_path=str(mathjax_script())))
    return files
