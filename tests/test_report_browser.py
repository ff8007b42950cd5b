"""report.html in a real browser (Debian's Chromium driven by Playwright, never a downloaded one):
every section shows, the verdict is what a person sees first, the stage badges read in ladder order,
nothing is fetched, nothing errs, and a string from the report stays text.

One browser launch for the module. With DISTVAL_SCREENSHOT=PATH the full-page screenshot is also
copied to PATH (how docs/ gets its picture of the page)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from distval.report.html import render_html
from test_report_html import SECTIONS, STAGE_STATUS, STAGES, XSS, run_report

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("no Chromium: install Debian's chromium (make test does as root)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")

VIEWPORT = {"width": 1280, "height": 900}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The run report opened in one page, with everything the page said or asked for while loading."""
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_html(run_report().to_dict()), encoding="utf-8")
    events: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "requests": [], "dialogs": []}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("console", lambda m: m.type == "error" and events["console_errors"].append(m.text))
            page.on("pageerror", lambda e: events["page_errors"].append(str(e)))
            page.on("request", lambda r: events["requests"].append(r.url))
            page.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))
            page.goto(path.as_uri(), wait_until="load")
            yield page, events, path
        finally:
            browser.close()


def test_every_section_is_present_and_visible(loaded):
    page, _, _ = loaded
    assert page.eval_on_selector_all("section", "els => els.map(e => e.id)") == SECTIONS
    for name in SECTIONS:
        assert page.locator(f"section#{name}").is_visible(), name


def test_the_verdict_is_seen_first(loaded):
    page, _, _ = loaded
    boxes = {name: page.locator(f"section#{name}").bounding_box() for name in SECTIONS}
    verdict = boxes["verdict"]
    assert verdict["y"] == min(box["y"] for box in boxes.values())
    assert [boxes[name]["y"] for name in SECTIONS] == sorted(box["y"] for box in boxes.values())
    assert 0 <= verdict["y"] and verdict["y"] + verdict["height"] <= VIEWPORT["height"]  # inside the first screen
    assert page.locator("section#verdict h1").inner_text().split() == ["distval", "run", "FAIL"]


def test_stage_badges_read_in_ladder_order(loaded):
    page, _, _ = loaded
    assert page.locator(".stage .stage-name").all_inner_texts() == STAGES
    assert page.locator(".stage .stage-status").all_inner_texts() == [STAGE_STATUS.get(s, "OK") for s in STAGES]
    # one row on a laptop-wide screen, left to right in ladder order
    xs = [page.locator(".stage").nth(i).bounding_box()["x"] for i in range(len(STAGES))]
    assert xs == sorted(xs)
    warn = page.locator(".stage", has_text="bench")
    assert warn.get_attribute("title").startswith("busbw under half the copy ceiling")


def test_nothing_errs_and_nothing_is_fetched(loaded):
    page, events, path = loaded
    assert events["console_errors"] == [] and events["page_errors"] == [] and events["dialogs"] == []
    assert events["requests"] == [path.as_uri()]


def test_a_string_from_the_report_stays_text(loaded):
    page, _, _ = loaded
    assert page.locator("script").count() == 0
    assert XSS in page.locator("section#findings").inner_text()


def test_figures_are_drawn(loaded):
    page, _, _ = loaded
    figures = page.locator("section#figures figure")
    assert figures.count() == 6
    for i in range(figures.count()):
        fig = figures.nth(i)
        assert fig.locator("svg").count() >= 1 and fig.locator("figcaption").is_visible()
        box = fig.locator("svg").first.bounding_box()
        assert box["width"] > 300 and box["height"] > 50  # laid out, not collapsed to nothing


def test_full_page_screenshot(loaded, tmp_path):
    page, _, _ = loaded
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("DISTVAL_SCREENSHOT"):
        target = Path(os.environ["DISTVAL_SCREENSHOT"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
