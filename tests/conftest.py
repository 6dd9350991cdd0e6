"""Fixtures shared across the stages' tests: the S3 server (``tests/s3server.py``)."""

pytest_plugins = ["tests.s3server"]
