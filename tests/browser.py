"""Headless Debian Chromium driven by Playwright: the page the browser tests use."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package; browsers are never downloaded


@contextmanager
def chromium_page() -> Iterator[object]:
    """A 1400x1000 tab with a 30 s default timeout, closed with its browser."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(30_000)
        yield tab
        browser.close()


def sign_in(tab: object, base_url: str, password: str, user: str = "") -> None:
    """Sign in on the dashboard's sign-in page (with the API token when ``user`` is
    empty) and wait for the navigation of a signed-in page."""
    tab.goto(f"{base_url}/login?next=/profiles")
    if user:
        tab.fill("#signin-user", user)
    tab.fill("#signin-password", password)
    tab.click("#signin-submit")
    tab.wait_for_selector("#nav-signout")
