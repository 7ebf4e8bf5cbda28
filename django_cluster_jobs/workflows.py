"""The read side of dependencies: workflow instances, their steps, and a layout to draw them.

A workflow instance is started by a run of a root job (a job that others wait for and that waits
for none); its id is that run's id and every dependent run carries it (``JobRun.instance``).
:func:`instance_of` returns an instance's graph: each job of the workflow with the state of its
run in the instance (the newest, a replay included), placed in columns by dependency depth for
the admin's drawing. Only reads; the writes are ``ledger.flows``'.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field

from .columns import holds_an_id
from .models import (
    FAILURE_STATES,
    LIVE_STATES,
    JobDefinition,
    JobDefinitionQuerySet,
    JobRun,
    JobRunQuerySet,
    RunState,
)
from .stored import tolerant

#: The ends of a step after which its instance cannot succeed unless a replay resumes it.
ENDED_WITHOUT_SUCCESS = (*FAILURE_STATES, RunState.SKIPPED, RunState.CANCELLED)

#: The drawing's geometry, in pixels: a step's box, and the gaps between columns and rows.
BOX_WIDTH, BOX_HEIGHT, COLUMN_GAP, ROW_GAP, MARGIN = 190, 46, 70, 18, 10


@dataclass
class Step:
    """One job of an instance: its run there (None while not queued yet) and its place."""

    job: str
    after: list[str]
    run: JobRun | None = None
    column: int = 0
    row: int = 0
    #: Where a door shows the run (the admin sets its change page).
    url: str = ""

    @property
    def state(self) -> str:
        return self.run.state if self.run is not None else "waiting"

    @property
    def x(self) -> int:
        return MARGIN + self.column * (BOX_WIDTH + COLUMN_GAP)

    @property
    def y(self) -> int:
        return MARGIN + self.row * (BOX_HEIGHT + ROW_GAP)


@dataclass
class Edge:
    """A line from a predecessor's box to its dependent's, for the drawing."""

    x1: int
    y1: int
    x2: int
    y2: int


@dataclass
class Instance:
    """A workflow instance: its root run, every step in drawing order and the lines between."""

    root: JobRun
    steps: list[Step]
    edges: list[Edge] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.root.pk

    @property
    def state(self) -> str:
        """succeeded when every step did; running while one is live or waits; failed when one
        ended without success and nothing is live."""
        states = {step.state for step in self.steps}
        if states == {RunState.SUCCEEDED}:
            return RunState.SUCCEEDED
        if states & set(LIVE_STATES) or not states & {*ENDED_WITHOUT_SUCCESS}:
            return RunState.RUNNING
        return RunState.FAILED

    @property
    def width(self) -> int:
        return 2 * MARGIN + (max(s.column for s in self.steps) + 1) * (BOX_WIDTH + COLUMN_GAP)

    @property
    def height(self) -> int:
        return 2 * MARGIN + (max(s.row for s in self.steps) + 1) * (BOX_HEIGHT + ROW_GAP)


def workflow_of(jobs: JobDefinitionQuerySet, root: str) -> dict[str, list[str]]:
    """The jobs that follow ``root``, directly or not, each with its predecessors; ``root`` too."""
    predecessors = jobs.predecessors()
    graph: dict[str, list[str]] = {root: []}
    grew = True
    while grew:
        found = {job: after for job, after in predecessors.items()
                 if job not in graph and set(after) & set(graph)}  # fmt: skip
        graph.update(found)
        grew = bool(found)
    return graph


def roots(runs: JobRunQuerySet, jobs: JobDefinitionQuerySet) -> JobRunQuerySet:
    """The runs that started an instance: runs of a job others wait for and that waits for
    none, which carry no instance themselves (a replay carries the one it resumes)."""
    predecessors = jobs.predecessors()
    leading = {name for after in predecessors.values() for name in after} - set(predecessors)
    return runs.filter(job__name__in=leading, instance__isnull=True)


def instance_of(alias: str, run_id: int) -> Instance | None:
    """The instance run ``run_id`` belongs to (or starts), with its steps; None when the run is
    gone or in no instance."""
    runs = tolerant(JobRun.objects.using(alias).select_related("job"))
    run = runs.filter(pk=run_id).first()
    if run is not None and run.instance and not holds_an_id(str(run.instance)):
        return None  # a stored instance that is no run's id (another program's write)
    root = run and (runs.filter(pk=run.instance).first() if run.instance else run)
    if root is None:
        return None
    graph = workflow_of(JobDefinition.objects.using(alias), root.job.name)
    if len(graph) == 1:
        return None
    newest = {r.job.name: r for r in runs.in_instance(root.pk).order_by("pk")}
    steps = {job: Step(job, after, newest.get(job)) for job, after in graph.items()}
    return _laid_out(Instance(root, list(steps.values())), steps)


def _laid_out(instance: Instance, steps: dict[str, Step]) -> Instance:
    """Place each step one column right of its deepest predecessor, and draw the lines."""
    try:
        order = list(graphlib.TopologicalSorter({
            s.job: [p for p in s.after if p in steps] for s in steps.values()
        }).static_order())  # fmt: skip
    except graphlib.CycleError:  # a cycle (check W007 reports it): draw the steps as they come
        order = list(steps)
    rows: dict[int, int] = {}
    placed = []
    for job in order:
        step = steps[job]
        before = [steps[p].column for p in step.after if p in steps and steps[p] in placed]
        step.column = 1 + max(before, default=-1)
        step.row = rows.get(step.column, 0)
        rows[step.column] = step.row + 1
        placed.append(step)
    instance.steps = placed
    instance.edges = [
        Edge(steps[p].x + BOX_WIDTH, steps[p].y + BOX_HEIGHT // 2, s.x, s.y + BOX_HEIGHT // 2)
        for s in placed
        for p in s.after
        if p in steps
    ]
    return instance
