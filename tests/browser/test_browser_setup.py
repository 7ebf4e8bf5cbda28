"""Without Chromium the browser tests fail, saying how to install it; they are never skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import conftest

pytestmark = pytest.mark.browser


def test_a_missing_chromium_fails_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest, "CHROMIUM", Path(tmp_path / "chromium"))
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y chromium"):
        conftest._chromium()


def test_the_system_chromium_is_the_one_used():
    assert Path(conftest._chromium()).name == "chromium"
