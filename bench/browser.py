"""Debian's headless Chromium driven by Playwright (which downloads no browser of its own here):
the report's test and its bench open pages through ``page``."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("PYPTO_OFFLINE_CHROMIUM", "/usr/bin/chromium")
# Flags that keep Chromium from reaching out on its own (update checks, sync, safe browsing).
QUIET_CHROMIUM = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-quic", "--disable-default-apps"]


class ChromiumMissing(RuntimeError):
    pass


# Why no browser opens, when one must not: tests/conftest.py sets it in the fast tier, which runs
# on machines without Chromium, so that a test opening a page fails there on every machine.
HIDDEN: str | None = None


@contextmanager
def page(width: int = 1280, height: int = 1400):
    """A fresh page in a fresh browser, closed on exit; its requests and script errors are
    collected in ``page.requests`` and ``page.errors``."""
    if HIDDEN:
        raise ChromiumMissing(HIDDEN)
    if not Path(CHROMIUM).exists():
        raise ChromiumMissing(f"Chromium not found at {CHROMIUM}: install Debian's 'chromium' "
                              f"package (make test does) or set PYPTO_OFFLINE_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=QUIET_CHROMIUM)
        try:
            opened = browser.new_page(viewport={"width": width, "height": height},
                                      accept_downloads=True)
            opened.requests, opened.errors = [], []
            opened.on("request", lambda request: opened.requests.append(request.url))
            opened.on("pageerror", lambda error: opened.errors.append(str(error)))
            yield opened
        finally:
            browser.close()


# Milliseconds from navigation to the end of the load event (the page's script has run: it
# runs at the end of the body), as the browser's own navigation timing says.
LOAD_MS = ("() => { const n = performance.getEntriesByType('navigation')[0]; "
           "return n.loadEventEnd - n.startTime; }")


def fastest_open_ms(uri: str, opens: int = 3) -> float:
    """The page's load time (``LOAD_MS``), the fastest of ``opens`` cold opens, each in a fresh
    browser: what the page costs, less what else a shared 2-core machine was running (one open
    of the same page varied from 1.4 s to 2.2 s here, docs/report.md)."""
    times = []
    for _ in range(opens):
        with page() as opened:
            opened.goto(uri)
            times.append(opened.evaluate(LOAD_MS))
    return min(times)
