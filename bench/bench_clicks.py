"""Every click of the dashboard's stories, timed in Chromium against ``make demo``.

Starts the demo (backend, dashboard, two CPU workers, seeded plans) in a fresh state
directory, signs in with Debian's Chromium, and walks the stories a person walks: each
page, planning and comparing, saving and approving, the plans list (duplicate, rename,
open in the Planner), launching a plan and stopping the run, the workers and clusters.
Each click is timed from the click to the page's answer on screen (the text or element
that answers it), Playwright's own round trips included. Target: every click under
``TARGET_MS`` on the 2-core machine with the demo running. Prints one line per click and
exits non-zero when one is slower.
"""

import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser import CHROMIUM, chromium_page, sign_in
from tests.deploy.demo_process import Demo

TARGET_MS = 300.0


def timed(name: str, act: Callable[[], None], answered: Callable[[], None],
          results: list[tuple[str, float]]) -> None:
    started = time.perf_counter()
    act()
    answered()
    results.append((name, (time.perf_counter() - started) * 1e3))


def walk(page: object, url: str) -> list[tuple[str, float]]:
    results: list[tuple[str, float]] = []
    wait = page.wait_for_selector

    def nav(name: str, link: str, ready: str) -> None:
        timed(f"open {name}", lambda: page.click(f"#nav-{link}"), lambda: wait(ready),
              results)

    nav("Profiles", "profiles", "#profiles-list table")
    nav("Planner", "planner", "#planner-prediction:has-text('Predicted step')")
    timed("run this planner", lambda: page.click("#planner-run"),
          lambda: wait("#planner-status :text('planned')"), results)
    timed("run all planners and compare", lambda: page.click("#planner-run-all"),
          lambda: wait("#planner-compare-table table"), results)
    page.fill("#planner-name", "timed plan")
    timed("save as draft", lambda: page.click("#planner-save"),
          lambda: wait("#planner-save-status :text('is draft')"), results)
    page.on("dialog", lambda dialog: dialog.accept())
    timed("approve", lambda: page.click("#planner-approve"),
          lambda: wait("#planner-save-status :text('is approved')"), results)
    nav("Plans", "plans", "#plans-table")
    page.click("#plans-select")
    page.get_by_role("option", name="timed plan").first.click()
    timed("duplicate a plan", lambda: page.click("#plans-duplicate"),
          lambda: wait("#plans-status :text('draft copy')"), results)
    page.fill("#plans-name", "timed plan, renamed")
    timed("rename a plan", lambda: page.click("#plans-rename"),
          lambda: wait("#plans-status :text('is now called')"), results)
    timed("open a plan in the Planner", lambda: page.click("#plans-open"),
          lambda: wait("#planner-status :text('Opened plan')"), results)
    nav("Runs", "runs", "#runs-status")
    page.click("#runs-plan")
    page.get_by_role("option", name="unbalanced").first.click()
    page.wait_for_function("() => document.querySelector('#runs-model').value === 'gpt'")
    page.fill("#runs-steps", "200")
    timed("launch", lambda: page.click("#runs-launch"),
          lambda: wait("#runs-launch-status :text('Launched run')"), results)
    page.wait_for_function("() => document.querySelector('#runs-status').innerText"
                           ".includes(': running')", timeout=90_000)
    timed("stop the run", lambda: page.click("#runs-stop"),
          lambda: wait("#runs-decision-status :text('is stopped')"), results)
    nav("Workers & clusters", "machines", "#machines-workers-table")
    return results


def main() -> int:
    if not CHROMIUM.exists():
        print(f"skipped: Debian's chromium is not installed at {CHROMIUM}")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        demo = Demo(Path(folder) / "state", "--port", "0")
        try:
            demo.wait_until_running(timeout_s=300)
            with chromium_page() as page:
                sign_in(page, demo.url, demo.token)
                results = walk(page, demo.url)
        finally:
            demo.stop(signal.SIGINT)
    slow = [(name, ms) for name, ms in results if ms > TARGET_MS]
    for name, ms in results:
        print(f"{name:32s} {ms:7.0f} ms  {'ok' if ms <= TARGET_MS else 'SLOW'}")
    print(f"median {statistics.median(ms for _, ms in results):.0f} ms, slowest "
          f"{max(ms for _, ms in results):.0f} ms; target every click <= {TARGET_MS:.0f} ms: "
          f"{'PASS' if not slow else 'FAIL (' + ', '.join(n for n, _ in slow) + ')'}")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
