"""Labelled runs for the detector evaluation: real tiny CPU training with injected faults (bench only)."""
