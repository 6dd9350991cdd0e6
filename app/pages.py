"""The dashboard's pages: script, title, icon and URL path. ``dashboard.py`` navigates them; ``backend_base`` needs
their URL paths to tell a page's name from a path prefix in an address."""

from __future__ import annotations

from typing import NamedTuple


class PageSpec(NamedTuple):
    script: str  # under screens/
    title: str
    icon: str
    url_path: str


PAGES = (
    PageSpec("overview.py", "Overview", ":material/monitor_heart:", "overview"),  # the default page
    PageSpec("run.py", "Run", ":material/show_chart:", "run"),
    PageSpec("compare.py", "Compare", ":material/compare_arrows:", "compare"),
    PageSpec("import_log.py", "Import", ":material/upload_file:", "import_log"),
)
URL_PATHS = tuple(p.url_path for p in PAGES)
