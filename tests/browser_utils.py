"""A headless browser for the live page's tests (and docs/benchmarks/dashboard/capture.py): Debian's chromium and
chromium-driver through Selenium, no driver download."""
from __future__ import annotations

import pytest


def browser():
    """Headless Chromium through Selenium, with Debian's chromium and chromium-driver (no driver download)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium / chromedriver not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,900"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def open_live_page(driver, url: str, key: str | None, timeout: float = 30.0) -> dict:
    """Open /dashboard, give it the key when it asks, wait until every chart has drawn with data; returns what the
    page shows: each chart's last plotted value and the acceptance since start."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/dashboard")
    if key:
        WebDriverWait(driver, timeout).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
        driver.find_element(By.ID, "key").send_keys(key)
        driver.find_element(By.ID, "use-key").click()
    charts = ("tokens_per_s", "ttft_s", "acceptance", "accepted_length", "methods")
    WebDriverWait(driver, timeout).until(
        lambda d: all(d.find_element(By.ID, c).get_attribute("data-drawn") for c in charts)
        and d.find_element(By.ID, "acceptance-total").get_attribute("data-value"))
    shown = {c: driver.find_element(By.ID, c).get_attribute("data-last") for c in charts}
    shown["acceptance_total"] = float(driver.find_element(By.ID, "acceptance-total").get_attribute("data-value"))
    return shown
