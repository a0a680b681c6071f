"""The page at / in a real browser: Debian's headless chromium driven through chromedriver.

Skipped, with the reason, where ``chromium`` or ``chromedriver`` (Debian: ``chromium``,
``chromium-driver``) is not on PATH; ``.ci/run`` installs both. Selenium is given both paths,
so it never runs Selenium Manager (which would try to download a driver).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.service_helpers import REPO, clean_environ, start_server, stop_server

__all__ = ["clean_environ"]

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver on PATH "
    "(apt-get install chromium chromium-driver; .ci/run installs them)",
)
#: the flags this machine needs: no sandbox (root), nothing fetched from the network
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1400",
)
HOTSPOT = REPO / "tests" / "fixtures" / "ptx" / "paper" / "hotspot.ptx"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, url = start_server()
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromium and chromedriver


def _wait(driver: Any, condition: str, timeout_s: float = 90.0) -> None:
    """Wait until the JavaScript expression ``condition`` is true in the page."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(
        lambda d: d.execute_script(f"return Boolean({condition});")
    )


def test_optimize_form_shows_the_shortlist_and_the_timeline(
    server: str, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(f"{server}/")
    for name, value in (("m", "1024"), ("n", "512"), ("k", "1024")):
        field = driver.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    Select(driver.find_element(By.ID, "optimize-device")).select_by_value("rtx-a6000")
    # Table 1 is the paper's model: its DRAM-stream loads, not the default L2-reuse term
    Select(driver.find_element(By.ID, "optimize-memory-model")).select_by_value("dram-stream")
    driver.find_element(By.ID, "optimize-submit").click()
    _wait(driver, "document.querySelector('#timeline svg [id=\"total\"]')")
    assert "memory model dram-stream" in driver.find_element(By.ID, "optimize-status").text
    rows = driver.find_elements(By.CSS_SELECTOR, "#shortlist tbody tr")
    assert len(rows) == 5
    first = [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")]
    # rank, tile, depth, group M, split K: the paper's kernel has neither raster groups nor split-K
    assert first[:2] == ["1", "128×64×128"]
    assert first[3:5] == ["1", "1"]
    assert rows[0].get_attribute("aria-selected") == "true"
    stages = driver.execute_script(
        'return document.querySelectorAll(\'#timeline svg [id$="-math"][id^="stage-"]\').length;'
    )
    assert stages == 8
    total = driver.execute_script(
        "return document.querySelector('#timeline svg [id=\"total\"]').textContent;"
    )
    assert "1,300.895 µs" in total  # Table 1's 128x64x128: W x wave + T_INIT
    driver.save_screenshot(str(tmp_path / "page-optimize.png"))
    assert (tmp_path / "page-optimize.png").stat().st_size > 10_000

    # another row draws that candidate's timeline
    rows[1].click()
    _wait(driver, "document.querySelector('#timeline').dataset.rank === '2'")
    assert "rank 2" in driver.find_element(By.ID, "timeline").text

    # left at its default, the form asks for no model and the answer names the profile's default
    Select(driver.find_element(By.ID, "optimize-memory-model")).select_by_value("")
    driver.find_element(By.ID, "optimize-submit").click()
    _wait(
        driver,
        "document.querySelector('#optimize-status').textContent.includes('memory model l2-reuse')",
    )


def test_predict_tab_shows_the_breakdown(server: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(f"{server}/")
    driver.find_element(By.ID, "tab-predict").click()
    # the PTX goes in as a value: typing 8 KB of text key by key is slow and beside the point
    driver.execute_script(
        "document.querySelector('textarea[name=ptx]').value = arguments[0];",
        HOTSPOT.read_text(),
    )
    form = driver.find_element(By.ID, "predict-form")
    Select(form.find_element(By.NAME, "device")).select_by_value("gtx-760")
    for name, value in (
        ("grid", "43,43"),
        ("block", "16,16"),
        ("registers_per_thread", "34"),
        ("trips", "BB0_4=2"),
    ):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    driver.find_element(By.ID, "predict-submit").click()
    _wait(driver, "document.querySelector('#breakdown svg [id=\"total\"]')")
    steps = driver.execute_script(
        "return document.querySelectorAll('#breakdown svg [id$=\"-comp\"]').length;"
    )
    assert steps == 4  # Hotspot's four level-1 supersteps (§2)
    assert "calculate_temp" in driver.find_element(By.ID, "prediction").text
    driver.save_screenshot(str(tmp_path / "page-predict.png"))
