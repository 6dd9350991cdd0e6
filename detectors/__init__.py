"""runwatch.detectors: pure functions from a run's series to findings, segments and rollback advice.

Entry points: ``analysis.analyze(rows, events, now)`` (offline, one run) and
``streaming.StreamingAnalyzer`` (live, row by row; same findings). One module
per failure mode: ``spike``, ``divergence``, ``scaler_collapse``, ``nan``,
``stall`` (stall and slowdown), ``straggler`` and ``rank_disagreement`` (the
fleet detectors, ranks compared step by step in ``fleet``), ``rank_stall``
(which rank a stall is about); ``fleet_analysis`` (every rank judged, offline
and live: what ``judge_run`` calls); ``segments`` (restarts and abandoned
branches), ``advisor`` (rollback advice), ``finding`` (the records),
``series`` (robust trailing baselines), ``segment_scan`` (all detectors over
one segment, shared by both paths). No I/O, no torch, no Streamlit here.
"""
