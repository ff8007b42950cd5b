"""report.html in a real browser (Debian's Chromium driven by Playwright, never a downloaded one):
every section shows, the verdict is what a person sees first, the stage badges read in ladder order,
nothing is fetched, nothing errs, and a string from the report stays text; a `scale` and `comm pairs`
report shows its scaling chart and pair heat map.

One browser launch for the module, each report in a page of its own. With DISTVAL_SCREENSHOT=PATH
the run report's full-page screenshot is also copied to PATH (how docs/ gets its picture of the page)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from distval.report.html import render_html
from test_report_html import HOSTS, SECTIONS, SLOW_NODE, STAGE_STATUS, STAGES, XSS, cluster_report, run_report

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("no Chromium: install Debian's chromium (make test does as root)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")

VIEWPORT = {"width": 1280, "height": 900}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Any:
    """The module's one Chromium (its start-up is the slow part)."""
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_report(browser: Any, path: Path, report: dict[str, Any]) -> tuple[Any, dict[str, list[str]]]:
    """`report` rendered to `path` and opened in a new page, with everything the page said or asked
    for while loading."""
    path.write_text(render_html(report), encoding="utf-8")
    events: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "requests": [], "dialogs": []}
    page = browser.new_page(viewport=VIEWPORT)
    page.on("console", lambda m: m.type == "error" and events["console_errors"].append(m.text))
    page.on("pageerror", lambda e: events["page_errors"].append(str(e)))
    page.on("request", lambda r: events["requests"].append(r.url))
    page.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    return page, events


@pytest.fixture(scope="module")
def loaded(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The run report opened in one page."""
    path = tmp_path_factory.mktemp("report") / "report.html"
    page, events = open_report(browser, path, run_report().to_dict())
    yield page, events, path
    page.close()


@pytest.fixture(scope="module")
def cluster_loaded(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A report with a `scaling` table and the pairs of 4 nodes (node 2 slow), in a second page."""
    path = tmp_path_factory.mktemp("cluster") / "report.html"
    page, events = open_report(browser, path, cluster_report().to_dict())
    yield page, events, path
    page.close()


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


def test_cluster_figures_are_drawn_without_errors(cluster_loaded):
    page, events, path = cluster_loaded
    assert events["console_errors"] == [] and events["page_errors"] == [] and events["requests"] == [path.as_uri()]
    for fig_id in ("fig-scaling", "fig-pairs"):
        fig = page.locator(f"figure#{fig_id}")
        assert fig.is_visible() and fig.locator("figcaption").is_visible(), fig_id
        box = fig.locator("svg").first.bounding_box()
        assert box["width"] > 300 and box["height"] > 150, fig_id


def test_scaling_chart_series_and_hollow_points(cluster_loaded):
    page, _, _ = cluster_loaded
    fig = page.locator("figure#fig-scaling")
    names = fig.locator("polyline.series").evaluate_all("els => els.map(e => e.dataset.series)")
    assert sorted(set(names)) == ["ideal", "measured", "planned"]
    for line in fig.locator("polyline.series").all():
        assert line.bounding_box()["width"] > 100, line.get_attribute("data-series")  # spans the world sizes
    # the 8-rank point (oversubscribed) is white inside, the others filled; both panels
    fills = fig.locator('circle.point[data-series="measured"]').evaluate_all(
        "els => els.map(e => [e.querySelector('title').textContent, getComputedStyle(e).fill])")
    assert len(fills) == 8
    for title, fill in fills:
        assert (fill == "rgb(255, 255, 255)") == title.startswith("world 8 "), title


def test_heat_map_cells_tooltips_and_outline(cluster_loaded):
    page, _, _ = cluster_loaded
    grid = page.locator("figure#fig-pairs svg").first
    cells = grid.locator("rect.cell")
    assert cells.count() == len(HOSTS) * (len(HOSTS) - 1)
    box = cells.first.bounding_box()
    assert box["width"] > 20 and box["height"] > 20
    titles = grid.locator("rect.cell title").all_text_contents()
    assert "node 2 (node-c) -> node 0 (node-a): 0.03 GB/s, round 1" in titles
    outlines = grid.locator("rect.outline")
    assert outlines.count() == 2 and outlines.first.get_attribute("data-node") == str(SLOW_NODE)
    assert grid.locator("text.weak", has_text="0.004x link · 1.00x compute").is_visible()
    # a value on a dark cell is written in white, on a light cell in dark grey
    inks = set(grid.locator("text.cell-value").evaluate_all("els => els.map(e => getComputedStyle(e).fill)"))
    assert inks == {"rgb(255, 255, 255)", "rgb(51, 51, 51)"}


def test_rank_grids_sit_side_by_side(cluster_loaded):
    page, _, _ = cluster_loaded
    tiles = page.locator("figure#fig-pairs svg.tile")
    assert tiles.count() == len(HOSTS)
    first, second = tiles.nth(0).bounding_box(), tiles.nth(1).bounding_box()
    assert second["x"] > first["x"] + first["width"] and second["y"] == first["y"]
    assert tiles.nth(0).locator("rect.cell").count() == 2
