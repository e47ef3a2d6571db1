"""Presentation: reads result tables, never runs an analysis.

- ``claims``: C1-C5 as values, each decided from intervals;
- ``takeaways``: sentences generated from the numbers;
- ``plots``: plotly figures;
- ``markup``: the HTML pieces the report's sections share (verdict styling);
- ``html``: the self-contained HTML report and its browser check;
- ``zoo``: the report's section on the controlled zoo (C3 from paired per-seed differences).
"""
