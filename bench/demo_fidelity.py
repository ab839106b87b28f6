"""The demo's first impression: does each seeded plan run as its prediction says?

Starts ``python -m pipestudio.demo`` (what ``make demo`` runs) on a port the OS picks and a
fresh state directory, so it measures the gpt model here, as its ranks will run it; signs
in to the dashboard in Debian's Chromium, launches each seeded plan from the Runs page and
reads, off the page's "Prediction against measurement" headline, the measured samples/s,
the plan's prediction and the prediction from the profile calibrated on the run, once the
comparison covers steps from ``--from-step`` on. Prints each with measured / predicted - 1.
Targets (an otherwise idle machine): within 25% of the prediction, 10% of the calibrated
one. Timings: run it with nothing else on the machine; the dashboard's own polling and
Chromium share it with the ranks.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNCALIBRATED_TARGET = 0.25
CALIBRATED_TARGET = 0.10
PLANS = ("gpt: 2 stages balanced by time", "gpt: 2 stages, unbalanced (try a repartition)")
HEADLINE = re.compile(
    r"Measured (?P<measured>[\d.]+) samples/s · predicted "
    r"(?P<predicted>[\d.]+) \(.*?\) · calibrated (?P<calibrated>[\d.]+) "
    r"\(.*?\) · steps (?P<first>\d+)\.\.(?P<last>\d+)"
)
CHROMIUM = Path("/usr/bin/chromium")


def start_demo(state: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    output = state / "demo-output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPESTUDIO_")}
    with output.open("wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "pipestudio.demo", "--port", "0", "--state-dir", str(state)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    deadline = time.monotonic() + 600
    while "Press Ctrl-C" not in output.read_text(errors="replace"):
        if demo.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the demo did not come up:\n{output.read_text()}")
        time.sleep(0.5)
    text = output.read_text()
    url = re.search(r"dashboard\s+(http://\S+)/", text)[1]  # type: ignore[index]
    token = re.search(r"API token\s+(\S+)", text)[1]  # type: ignore[index]
    return demo, url, token


def read_plan(page: object, plan: str, from_step: int) -> tuple[float, float, float]:
    page.click("#runs-plan")  # type: ignore[attr-defined]
    page.get_by_role("option", name=plan).first.click()  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelector('#runs-model').value === 'gpt'"
    )
    page.fill("#runs-steps", "100000")  # type: ignore[attr-defined]
    before = page.inner_text("#runs-launch-status")  # type: ignore[attr-defined]
    page.click("#runs-launch")  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "before => { const t = document.querySelector('#runs-launch-status').innerText;"
        " return t.includes('Launched run') && t !== before; }",
        arg=before,
    )
    notice = page.inner_text("#runs-launch-status")  # type: ignore[attr-defined]
    run_id = re.search(r"Launched run (\d+)", notice)[1]  # type: ignore[index]
    # the monitor shows the new run (and its comparison, drawn with it) from here on
    page.wait_for_function(  # type: ignore[attr-defined]
        f"() => document.querySelector('#runs-status').innerText.startsWith('Run {run_id} ')"
    )
    deadline = time.monotonic() + 300
    while True:
        found = HEADLINE.search(page.inner_text("#runs-fidelity"))  # type: ignore[attr-defined]
        if found and int(found["first"]) >= from_step:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no comparison from step {from_step} on for {plan}")
        time.sleep(1)
    page.click("#runs-stop")  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelector('#runs-status').innerText.includes(': stopped')"
    )
    return float(found["measured"]), float(found["predicted"]), float(found["calibrated"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--from-step",
        type=int,
        default=20,
        help="read once the comparison starts at this step (default 20)",
    )
    options = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as state:
        demo, url, token = start_demo(Path(state))
        try:
            with sync_playwright() as driver:
                browser = driver.chromium.launch(executable_path=str(CHROMIUM))
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(90_000)
                page.goto(f"{url}/login?next=/runs")
                page.fill("#signin-password", token)
                page.click("#signin-submit")
                page.wait_for_selector("#runs-plan")
                figures = {plan: read_plan(page, plan, options.from_step) for plan in PLANS}
                browser.close()
        finally:
            os.killpg(demo.pid, signal.SIGINT)
            demo.wait(60)
    passed = True
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for plan, (measured, predicted, calibrated) in figures.items():
        before, after = measured / predicted - 1, measured / calibrated - 1
        passed &= abs(before) <= UNCALIBRATED_TARGET and abs(after) <= CALIBRATED_TARGET
        print(
            f"{plan}: measured {measured:.1f} samples/s, predicted {predicted:.1f} "
            f"({before:+.1%}), calibrated {calibrated:.1f} ({after:+.1%})"
        )
    print(
        ("PASS" if passed else "FAIL") + f": targets {UNCALIBRATED_TARGET:.0%} uncalibrated, "
        f"{CALIBRATED_TARGET:.0%} calibrated"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
