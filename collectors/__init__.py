"""runwatch.collectors: where records come from (torch hooks on a live loop, importers for archived logs).

``Monitor`` needs torch; it is imported lazily so offline use works without it.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("Monitor", "MonitorConfig"):
        from runwatch.collectors import monitor

        return getattr(monitor, name)
    if name == "UploaderConfig":  # Monitor(s3://..., upload=UploaderConfig(...))
        from runwatch.collectors.uploader import UploaderConfig

        return UploaderConfig
    raise AttributeError(name)


__all__ = ["Monitor", "MonitorConfig", "UploaderConfig"]
