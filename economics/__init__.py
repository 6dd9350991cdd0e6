"""runwatch.economics: what checkpointing and interruptions cost a run, and what cadence and retention to use.

Pure arithmetic over the record and the detectors' findings (no I/O, no
torch, no Streamlit): ``measure`` (checkpoint cost and size, interruptions,
lost work, goodput, from the run's own record), ``cadence`` (Young's and
Daly's intervals, the expected waste at any interval), ``retention`` (a
checkpoint ladder sized by the run's measured detection lag) and ``advice``
(all of it as the ``runwatch advise`` object).
"""
