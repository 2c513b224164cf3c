"""Real headless Chromium (Debian's `chromium`, driven by Playwright): the fixtures the
browser tests and the real-node tests share (their conftests import them).
Screenshots go to artifacts/browser/ (git-ignored; KUBETRAIN_TEST_ARTIFACTS moves them)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# As root in a container: no sandbox; nothing of the browser reaches out on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    where = Path(os.environ.get("KUBETRAIN_TEST_ARTIFACTS", ROOT / "artifacts")) / "browser"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is not installed: apt-get install chromium (.ci/run does)")
    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh temporary user data directory.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Page, url: str, token: str) -> None:
    """Through the sign-in form of the `kubetrain serve` at `url`, as a person would."""
    page.goto(f"{url}/ui/")
    expect(page.locator("h1")).to_have_text("Sign in")
    page.fill("#token", token)
    page.click("form button[type=submit]")
    page.wait_for_url("**/jobs")
