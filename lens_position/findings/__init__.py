"""What a run found, computed once: the layer between the analyses and what shows them.

:class:`~lens_position.findings.run.Findings` holds a run's tables (split into the main models' and
the zoo's, sliced by architecture once: :class:`lens_position.core.run_tables.RunTables`), its
claims table, C3 at each length and the sentences the console opens with. The report, the command
line and the written ``claims.csv`` read these values; none of them recomputes a claim.
"""

from lens_position.findings.run import Findings, verdict_lines

__all__ = ["Findings", "verdict_lines"]
