"""The playground in a real headless Chromium: type a prompt, watch coloured tokens stream in.

Needs Debian's `chromium` and the `playwright` Python package (scripts/test.sh installs both). If
the browser cannot start, this test fails: it never skips silently.
"""
import shutil

import pytest

pytestmark = pytest.mark.integration  # servers, a browser, real models or every family: not the fast tier

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_playground_streams_coloured_tokens(server, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.fill("#prompt", "w7 w8 w9")
            page.click("#send")
            page.wait_for_selector("#log span.verify", timeout=30000)
            page.wait_for_function("document.querySelector('#stats').textContent.includes('tokens/round')",
                                   timeout=30000)
            spans = page.locator("#log span").count()
            stats = page.text_content("#stats")
            page.screenshot(path=str(tmp_path / "playground.png"))
        finally:
            browser.close()
    assert spans >= 1 and "acceptance" in stats


@pytest.mark.parametrize("path", ["/"])
def test_page_has_no_external_assets(server, path):
    import httpx

    html = httpx.get(server.url + path).text
    assert "<script src=" not in html and "<link" not in html
