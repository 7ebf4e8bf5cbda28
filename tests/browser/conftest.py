"""The admin in a real browser: Playwright driving the system's Chromium against the live server.

The browser is Debian's ``chromium`` (never a browser Playwright downloads). When it or the
``playwright`` package is missing, every browser test fails with the command that installs it:
these tests are part of the suite and CI runs them, so they are never skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests import timing

#: Where Debian's chromium package puts the browser.
CHROMIUM = Path("/usr/bin/chromium")
#: How long one step in the browser may take before the test fails, in milliseconds (Playwright's
#: unit): a hang guard, as a page of the live server loads in well under a second.
STEP_MS = timing.scaled(15) * 1000
PASSWORD = "browser-tests-only"


def _chromium() -> str:
    found = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if found is None:
        pytest.fail(
            "The browser tests need Chromium, which is not installed. Install it with\n"
            "    apt-get install -y chromium\n"
            "(Debian's package; .ci/run installs it when it is missing).",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """One headless Chromium for the tests of a module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "The browser tests need the playwright package: pip install -e '.[test]'",
            pytrace=False,
        )
    executable = _chromium()
    # Playwright's sync API keeps an event loop running in this thread while it is started, and
    # Django refuses ORM calls from a thread with a running loop. The test body's ORM calls are
    # synchronous code that merely shares the thread with that loop, so Django is told to allow
    # them, for these modules only, while the browser is up.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=executable, headless=True)
            yield chromium
            chromium.close()


@pytest.fixture
def admin_page(browser, live_server):
    """A new browser page, logged in to the admin as a superuser through the login form."""
    User.objects.create_superuser("admin", "admin@example.com", PASSWORD)
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(STEP_MS)
    page = context.new_page()
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    yield page
    context.close()
