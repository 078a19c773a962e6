"""A real headless Chromium driven by Selenium through Debian's chromedriver (nothing downloads a browser).

``scripts/test.sh`` installs ``chromium`` and ``chromium-driver`` with apt-get where it can;
elsewhere the tests that need them are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

LOCAL_SCHEMES = {"file", "data", "blob", "about", "chrome"}


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("headless Chromium and chromedriver are not installed (scripts/test.sh installs them with apt-get)")
    pytest.importorskip("selenium", reason="selenium is in the dev extra")
    return chromium, driver


@contextlib.contextmanager
def chromium(width: int = 1300, height: int = 1000, offline: bool = True) -> Iterator:
    """A Selenium driver for headless Chromium, with network access cut off unless ``offline`` is False.

    The performance log records every request the page makes (see :func:`network_requests`).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _binaries()
    # Chromium's own profile folder is left in /tmp when it is killed: one of ours goes with the test.
    with tempfile.TemporaryDirectory(prefix="threadweaver-chromium-", ignore_cleanup_errors=True) as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            if offline:
                driver.execute_cdp_cmd("Network.enable", {})
                driver.execute_cdp_cmd(
                    "Network.emulateNetworkConditions",
                    {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0},
                )
            yield driver
        finally:
            driver.quit()


def network_requests(driver) -> list[str]:
    """The URLs of every request the page has made since the last call."""
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def remote(urls: list[str]) -> list[str]:
    return [url for url in urls if urlparse(url).scheme not in LOCAL_SCHEMES]


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait_until(driver, condition, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def open_page(driver, path) -> None:
    """Load a page from a file and wait until its script has rendered it."""
    driver.get(path.as_uri())
    wait_until(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true")
