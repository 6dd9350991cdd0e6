"""Where the real logs of ``../shared/realruns`` are, for every test that reads them: ``RUNWATCH_REALRUNS``,
else beside the checkout, else the project machines' ``/work/shared/realruns``. Tests skip without them."""

from __future__ import annotations

import os
from pathlib import Path

REALRUNS = Path(os.environ.get("RUNWATCH_REALRUNS", Path(__file__).resolve().parents[2] / "shared" / "realruns"))
if not REALRUNS.is_dir():
    REALRUNS = Path("/work/shared/realruns")
BLOCKS = REALRUNS / "bigscience-chronicles-excerpts" / "blocks"
