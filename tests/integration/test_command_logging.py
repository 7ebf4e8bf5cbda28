"""``runscheduler`` and ``runjob`` log through the project's logging, adding a handler only
when the project configured none, and never stop the package's records from propagating."""

import logging
import signal

import pytest
from django.core.management import call_command

from django_cluster_jobs.management.commands.runscheduler import configure_logging

PACKAGE = logging.getLogger("django_cluster_jobs")


@pytest.fixture
def package_logging(monkeypatch):
    """The package logger and the root logger as the test leaves them, restored after."""
    monkeypatch.setattr(PACKAGE, "handlers", list(PACKAGE.handlers))
    monkeypatch.setattr(PACKAGE, "level", PACKAGE.level)
    monkeypatch.setattr(PACKAGE, "propagate", PACKAGE.propagate)
    return PACKAGE


def test_a_configured_project_keeps_its_handlers_and_propagation(package_logging, caplog):
    configured = list(package_logging.handlers)
    assert configured, "tests/settings.py configures a handler for the package"
    assert configure_logging(1, "node-a") is None
    assert package_logging.handlers == configured and package_logging.propagate
    logging.getLogger("django_cluster_jobs.engine.node").info("reaches the project")
    assert [r.getMessage() for r in caplog.records] == ["reaches the project"]


def test_verbosity_sets_the_package_level(package_logging):
    for verbosity, level in ((0, logging.WARNING), (1, logging.INFO), (2, logging.DEBUG)):
        configure_logging(verbosity, "node-a")
        assert package_logging.level == level


def test_a_project_with_no_handler_gets_one_on_stderr(package_logging, monkeypatch, capsys):
    monkeypatch.setattr(package_logging, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    handler = configure_logging(1, "node-a")
    assert package_logging.handlers == [handler] and package_logging.propagate
    assert configure_logging(1, "node-a") is None, "a second call adds a second handler"
    logging.getLogger("django_cluster_jobs.engine.node").info("on stderr")
    assert capsys.readouterr().err.endswith("[node-a] INFO on stderr\n")


def test_a_handler_on_the_root_logger_counts_as_configured(package_logging, monkeypatch):
    monkeypatch.setattr(package_logging, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    assert configure_logging(1, "node-a") is None
    assert package_logging.handlers == [] and package_logging.propagate


@pytest.mark.django_db(transaction=True)
def test_runscheduler_logs_through_the_projects_logging(package_logging, monkeypatch, caplog):
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # keep pytest's own handlers
    configured = list(package_logging.handlers)
    with caplog.at_level(logging.INFO, logger="django_cluster_jobs"):
        call_command("runscheduler", "--once", "--node-id", "logged", verbosity=1)
    assert package_logging.handlers == configured and package_logging.propagate
    assert any("node logged started with" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_runjob_leaves_the_package_logger_as_it_found_it(package_logging, monkeypatch):
    monkeypatch.setattr(package_logging, "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    package_logging.setLevel(logging.ERROR)
    call_command("runjob", "tests.manual", verbosity=0)
    assert package_logging.handlers == [] and package_logging.level == logging.ERROR
    assert package_logging.propagate
