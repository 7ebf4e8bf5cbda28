"""The end of a CI run: what each job did, and every failure with where to read about it.

    python3 scripts/ci_report.py RESULTS_DIR TOTAL_SECONDS

RESULTS_DIR holds, per job, ``<job>.label`` (Python and Django), ``<job>.databases``,
``<job>.log`` (its whole output), ``<job>.seconds`` (its time), ``<job>.rc`` (its exit code),
``<job>.steps`` (scripts/test.sh's STEPS_FILE: ``status|step|seconds|detail`` per line) and
``<job>/*.xml`` (JUnit XML, one per pytest run); ``setup.steps`` holds the steps of no job
(installs, the docs build) as ``status|step|seconds|detail|log``.

The report ends with the failures, so that the last lines of the CI output name each one: the
job, the test id or the step, the first line of its assertion or error, and the log file. A
pytest run that failed without a report naming a failing test (killed, crashed, timed out) and a
job that ended badly without a failed step are named too. Standard library only: it runs
whatever became of the virtual environments.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: At most this many failures are listed one by one; the rest are counted.
MAX_LISTED = 30
#: Skip reasons shown per job, the most frequent first.
MAX_REASONS = 3


@dataclass
class Job:
    name: str
    label: str
    log: Path
    counts: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    wall: str = "?"
    databases: str = ""
    failures: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    #: The parts (``sqlite-timing``…) whose JUnit report names at least one failure or error.
    failed_parts: set[str] = field(default_factory=set)

    def reported_failures(self, step: str) -> bool:
        """Whether the JUnit report of a ``pytest on … (part)`` step names a failure."""
        part = step.rpartition("(")[2].rstrip(")")
        return any(run.endswith(f"-{part}") for run in self.failed_parts)


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:160]
    return "(no message)"


def test_id(case: ET.Element) -> str:
    """pytest's id of a JUnit test case (xunit1 reports carry the file)."""
    path, name = case.get("file", ""), case.get("name", "")
    klass = case.get("classname", "").rpartition(".")[2]
    if klass[:1].isupper() and Path(path).stem != klass:
        return f"{path}::{klass}::{name}"
    return f"{path or case.get('classname', '')}::{name}"


def read_reports(job: Job, folder: Path) -> None:
    for report in sorted(folder.glob("*.xml")):
        run = report.stem
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError as exc:
            job.failures.append(f"[{job.label}, {run}] unreadable report {report}: {exc}")
            continue
        for suite in root.iter("testsuite"):
            job.seconds += float(suite.get("time") or 0)
        for case in root.iter("testcase"):
            outcome = "passed"
            for kind in ("failure", "error", "skipped"):
                found = case.find(kind)
                if found is None:
                    continue
                outcome = "failed" if kind == "failure" else kind
                message = first_line(found.get("message") or found.text)
                if kind == "skipped":
                    job.reasons[message.removeprefix("Skipped: ")] += 1
                else:
                    job.failures.append(f"[{job.label}, {run}] {test_id(case)} — {message}")
                    job.failed_parts.add(run)
                break
            job.counts[outcome] += 1


def read_steps(job: Job, steps: Path) -> None:
    """The job's steps; a failed one is named unless its JUnit report names its failures."""
    if not steps.exists():
        return
    for line in steps.read_text().splitlines():
        status, name, seconds, detail = [*line.split("|", 3), "", "", ""][:4]
        job.steps.append(f"{name} {status} ({seconds}s)")
        if status == "passed":
            continue
        if not name.startswith("pytest on"):
            job.failures.append(f"[{job.label}] {name} failed — {first_line(detail)}")
        elif "exit code" not in detail or not job.reported_failures(name):
            why = "its report names no failing test" if "exit code" in detail else ""
            job.failures.append(f"[{job.label}] {name} — {detail}{'; ' + why if why else ''}")


def load(results: Path) -> list[Job]:
    jobs = []
    for label in sorted(results.glob("*.label")):
        name = label.stem
        job = Job(name, f"{name}: {label.read_text().strip()}", results / f"{name}.log")
        if (databases := results / f"{name}.databases").exists():
            job.databases = databases.read_text().strip()
        read_reports(job, results / name)
        read_steps(job, results / f"{name}.steps")
        if (wall := results / f"{name}.seconds").exists():
            job.wall = wall.read_text().strip()
        if not job.steps:
            job.failures.append(f"[{job.label}] ended before its first step")
        rc = results / f"{name}.rc"
        code = rc.read_text().strip() if rc.exists() else "none"
        if code != "0" and not job.failures:
            why = "timed out (JOB_TIMEOUT)" if code == "124" else f"exit code {code}"
            job.failures.append(f"[{job.label}] make test ended badly: {why}, no step names why")
        jobs.append(job)
    return jobs


def setup_failures(results: Path) -> tuple[list[str], list[str]]:
    done, failed = [], []
    steps = results / "setup.steps"
    for line in steps.read_text().splitlines() if steps.exists() else []:
        status, name, seconds, detail, log = [*line.split("|", 4), "", "", "", ""][:5]
        done.append(f"{name}: {status} ({seconds}s)")
        if status != "passed":
            failed.append(f"[setup] {name} failed — {first_line(detail)} (log: {log})")
    return done, failed


def summary(job: Job) -> list[str]:
    c = job.counts
    lines = [
        f"{job.label} on {job.databases}",
        f"    {c['passed']} passed, {c['skipped']} skipped, {c['failed'] + c['error']} failed"
        f" ({c['error']} errors); {job.wall}s ({job.seconds:.0f}s in pytest); log: {job.log}",
    ]
    for reason, n in job.reasons.most_common(MAX_REASONS):
        lines.append(f"    skipped {n}x: {reason}")
    if len(job.reasons) > MAX_REASONS:
        others = sum(job.reasons.values()) - sum(n for _, n in job.reasons.most_common(3))
        lines.append(f"    skipped {others}x for {len(job.reasons) - MAX_REASONS} other reasons")
    return lines


def main(results: Path, total: int) -> int:
    jobs = load(results)
    done, failures = setup_failures(results)
    for job in jobs:
        failures += [f"{f} (log: {job.log})" for f in job.failures]
    print("\n==== CI summary " + "=" * 54)
    print("  " + "; ".join(done))
    for job in jobs:
        print("\n".join(summary(job)))
    print(f"total: {total}s")
    if not failures:
        print("CI passed")
        return 0
    print(f"\n==== CI FAILED: {len(failures)} failure(s), each on one line " + "=" * 24)
    for failure in failures[:MAX_LISTED]:
        print(failure)
    if len(failures) > MAX_LISTED:
        print(f"… and {len(failures) - MAX_LISTED} more: see the logs above")
    print(f"CI FAILED ({len(failures)} failure(s), total {total}s)")
    return 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
