"""The demo in Chromium, as a newcomer walks it: ``python -m pipestudio.demo`` comes up with
two CPU workers, the dashboard shows the seeded profiles and plans, a seeded plan is
launched from the Runs page and its metrics stream in; Ctrl-C then stops every process the
demo started, the training ranks included. Screenshots go to test-output/deploy/."""

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipestudio.demo import GPT_PROFILE_NAME
from tests.browser import CHROMIUM, chromium_page, sign_in
from tests.conftest import ROOT
from tests.deploy.demo_process import Demo

playwright_api = pytest.importorskip("playwright.sync_api")
SHOTS = ROOT / "test-output" / "deploy"
PLAN_NAME = "gpt: 2 stages balanced by time"
LOSS_POINTS = ("() => { const g = document.querySelector('#runs-loss-graph .js-plotly-plot');"
               " return g && g.data && g.data.length ? g.data[0].x.length : 0; }")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(),
                                 reason="Debian's chromium is not installed at /usr/bin/chromium "
                                        "(apt-get install -y chromium)")]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path / "state")
    try:
        yield running
    finally:
        running.stop(signal.SIGKILL)  # only when the test failed before its own stop


@pytest.fixture
def page() -> Iterator[object]:
    with chromium_page() as tab:
        yield tab


def shot(page: object, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def open_dashboard(page: object, demo: Demo) -> None:
    page.goto(f"{demo.url}/profiles")
    page.wait_for_selector("#signin-password")  # the dashboard asks who you are first
    shot(page, "demo-sign-in")
    sign_in(page, demo.url, demo.token)
    try:
        page.wait_for_selector("#nav-runs", timeout=20_000)
    except playwright_api.TimeoutError:
        shot(page, "demo-no-dashboard")
        raise AssertionError(f"{demo.url}/profiles shows no dashboard: `pipestudio serve` "
                             "must serve it in the backend's process") from None


def test_demo_walkthrough(demo: Demo, page: object) -> None:
    banner = demo.wait_until_running(timeout_s=240)
    assert "2 of 2 CPU workers online" in banner, banner
    open_dashboard(page, demo)
    page.wait_for_selector(f"text={GPT_PROFILE_NAME}")
    shot(page, "demo-profiles")

    page.click("#nav-runs")
    page.click("#runs-plan")
    page.get_by_role("option", name=PLAN_NAME).first.click()
    # the model and its arguments come from the measured profile's metadata
    page.wait_for_function("() => document.querySelector('#runs-model').value === 'gpt'")
    assert "layers=8" in page.input_value("#runs-model-args")
    page.fill("#runs-steps", "100000")
    page.click("#runs-launch")
    page.wait_for_selector("text=Launched run")
    page.wait_for_function("() => document.querySelector('#runs-status').innerText"
                           ".includes(': running')", timeout=90_000)
    page.wait_for_function(f"() => ({LOSS_POINTS})() >= 3", timeout=90_000)
    first = page.evaluate(f"({LOSS_POINTS})()")
    page.wait_for_function(f"() => ({LOSS_POINTS})() > {first}", timeout=30_000)
    shot(page, "demo-runs-live")

    status, left = demo.stop(signal.SIGINT)
    assert status == 0, demo.text()
    assert not left, f"still running after Ctrl-C: {left}"
