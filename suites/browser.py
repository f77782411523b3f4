"""Headless Chromium through Playwright: open a local page, collect its console errors and
uncaught exceptions. No browser download: it launches the system's ``chromium`` (Debian's
package; ``.ci/run`` installs it)."""

import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# Without the background-networking flags Chromium's connections are refused by a closed network.
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
VIEWPORT = {"width": 1400, "height": 1000}
TIMEOUT_MS = 60_000


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable() -> str | None:
    """Why a browser cannot run here (None: it can). The GPU machines have neither Chromium
    nor Playwright: the report tests that need them skip there, the rest run."""
    if chromium_path() is None:
        return "no chromium on PATH (apt-get install chromium; .ci/run does)"
    if importlib.util.find_spec("playwright") is None:
        return "no playwright (pip install -r requirements-test.txt)"
    return None


@contextmanager
def launch() -> Iterator["Browser"]:
    """The system Chromium, headless, closed on exit."""
    from playwright.sync_api import sync_playwright  # here, so that this module loads without it

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=FLAGS, headless=True, timeout=TIMEOUT_MS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_page(browser: "Browser", path: str) -> Iterator[tuple["Page", list[str]]]:
    """A fresh page with the local file ``path`` loaded, and the live list of its console
    errors and uncaught exceptions."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "assert") else None)
        page.on("pageerror", lambda e: errors.append((e.stack or f"{e.name}: {e.message}")[:500]))
        page.goto("file://" + os.path.abspath(path), wait_until="load")
        yield page, errors
    finally:
        context.close()
