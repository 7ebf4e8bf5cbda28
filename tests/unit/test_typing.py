"""The ``job`` decorator's typing, checked by mypy so that it cannot silently regress.

A decorated function keeps its signature (``Job[P, R]``, ParamSpec) for callers and type
checkers, and ``takes_context=True`` demands a handler whose first positional parameter takes a
RunContext. Each line of the sample below that must fail carries ``# error: <code>``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
from django_cluster_jobs import Job, RunContext, job


@job
def plain(x: int, label: str = "") -> float:
    return float(x)


@job(cron="0 9 * * *")
def inferred(ctx: RunContext, n: int = 0) -> str:
    return ctx.job


@job(takes_context=True)
def told(run: RunContext, n: int) -> int:
    return n


reveal_type(plain)
reveal_type(inferred)
reveal_type(told)
ok: float = plain(1, label="x")
same: Job[[int, str], float] = plain
plain("one")  # error: arg-type
plain(1, colour="red")  # error: call-arg
wrong: str = plain(1)  # error: assignment
told(1, 2)  # error: arg-type


@job(takes_context=True)  # error: arg-type
def keyword_only(*, n: int) -> None: ...
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict[int, list[str]]:
    folder = tmp_path_factory.mktemp("typing")
    sample = folder / "sample.py"
    sample.write_text(SAMPLE)
    stdout, stderr, _ = mypy_api.run(
        [
            "--config-file", str(ROOT / "pyproject.toml"),
            # A cache of its own: a shared one would replay the errors of an earlier sample path.
            "--cache-dir", str(folder / "cache"),
            "--no-error-summary", "--show-error-codes", "--hide-error-context",
            str(sample),
        ]
    )  # fmt: skip
    assert not stderr, stderr
    lines: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        found = re.match(rf"{re.escape(str(sample))}:(\d+): (.*)", line)
        if found:
            lines.setdefault(int(found.group(1)), []).append(found.group(2))
    return lines


def line_of(text: str) -> int:
    return SAMPLE.splitlines().index(text) + 1


def test_a_decorated_function_keeps_its_signature(report):
    assert report[line_of("reveal_type(plain)")] == [
        'note: Revealed type is "django_cluster_jobs.registry.Job[[x: int, label: str =], float]"'
    ]
    assert (
        "Job[[ctx: django_cluster_jobs.context.RunContext, n: int =], str]"
        in (report[line_of("reveal_type(inferred)")][0])
    )
    # The context becomes positional-only: a job called directly takes it first.
    assert (
        "Job[[django_cluster_jobs.context.RunContext, n: int], int]"
        in (report[line_of("reveal_type(told)")][0])
    )


def test_exactly_the_marked_lines_fail(report):
    expected = {
        number: [f"[{code}]" for code in re.findall(r"# error: ([\w-]+)", text)]
        for number, text in enumerate(SAMPLE.splitlines(), start=1)
        if "# error:" in text
    }
    errors = {
        number: [message[message.rindex("[") :] for message in messages if "error:" in message]
        for number, messages in report.items()
    }
    assert {number: found for number, found in errors.items() if found} == expected
