"""runwatch.detectors: pure functions from a run's series to findings, segments and rollback advice."""
