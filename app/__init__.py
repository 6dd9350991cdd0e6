"""runwatch.app: the command line, the dashboard and alerts: the last stage, it reads through data/ and detectors/."""
