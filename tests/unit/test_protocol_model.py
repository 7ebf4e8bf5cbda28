"""A model of the settled-through protocol under random histories (hypothesis).

The model keeps the ledger of one fixed-rate job in memory and drives it through random sequences
of time passing, node claims (some missed: a busy node), outages, leader passes, pauses (timed or
not), resumes, disables, enables, schedule edits, node re-plans and purges. It uses the product's
own pieces wherever they are pure: which occurrences of (mark, until] are due
(``ledger.settle.span_of``), the misfire policy (``policies.misfire.decide``), the claim gate
(``coordination.orm.slot_refused``), the node's re-plan point (the later of the mark and what it
collected) and the rule that a change settles under the old definition and moves the mark.

After every step it checks the invariant of docs/explanation/settled-through.md: no occurrence is
ever decided twice (even after its row was purged), none is decided that was not due (paused,
disabled, off the schedule in effect, before the job existed), and every due occurrence at or
before the mark is decided — so once a leader has passed, none older than the grace is left.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from django_cluster_jobs.choices import Misfire
from django_cluster_jobs.coordination import Claim
from django_cluster_jobs.coordination.orm import slot_refused
from django_cluster_jobs.ledger.settle import span_of
from django_cluster_jobs.models import JobDefinition
from django_cluster_jobs.policies.misfire import Policy, decide
from django_cluster_jobs.schedules import Every, occurrence_key

T0 = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
GRACE, BEAT = 5 * SECOND, SECOND
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)


@dataclass(frozen=True)
class State:
    """What governs the occurrences after a change: the definition's due-altering columns."""

    since: datetime
    enabled: bool
    paused_until: datetime | None
    interval: int
    revision: int = 0

    def due(self, at: datetime) -> bool:
        on_grid = int(at.timestamp()) % self.interval == 0
        unpaused = self.paused_until is None or at >= self.paused_until
        return at > self.since and self.enabled and unpaused and on_grid


class Protocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.up = True
        self.mark = T0
        self.states = [State(T0, True, None, 1)]
        self.rows: dict[str, tuple[str, datetime | None]] = {}  # key -> (state, finished_at)
        self.decided: Counter[str] = Counter()  # every decision ever made, never purged
        self.node_copy = self.states[-1]
        self.collected = T0

    # -- the job as the database holds it ----------------------------------------------------

    @property
    def state(self) -> State:
        return self.states[-1]

    def definition(self, state: State | None = None) -> JobDefinition:
        state = state or self.state
        return JobDefinition(
            pk=1, name="model", callable_name="tests.manual", schedule_kind="every",
            interval=state.interval * SECOND, placement="cluster", enabled=state.enabled,
            paused_until=state.paused_until, settled_through=self.mark, misfire=self.misfire,
            catch_up_limit=2, catch_up_window=None, overlap="allow", payload={},
            revision=state.revision,
        )  # fmt: skip

    def decide(self, key: str, state: str, finished: datetime | None) -> None:
        if key not in self.rows:  # the unique (job, key): exactly one writer gets a row in
            self.rows[key] = (state, finished)
            self.decided[key] += 1

    def settle(self, until: datetime, state: State, record_only: bool = False) -> None:
        """ledger.settle.settle, in memory: decide what has no row, move the mark."""
        span = span_of(self.definition(state), until)
        missing = [at for at in span.occurrences if occurrence_key(at) not in self.rows]
        live = [k for k, (s, _) in self.rows.items() if s == "pending"]
        policy = Policy.of(self.definition(state))
        if record_only:
            policy = replace(policy, misfire=Misfire.SKIP)
        plan = decide(policy, missing, self.now, catching_up=live[0] if live else None)
        for at, _why in plan.missed:
            self.decide(occurrence_key(at), "missed", self.now)
        for at in plan.runs:
            self.decide(occurrence_key(at), "pending", None)
        self.mark = max(self.mark, until)

    def change(self, *, stops: bool = False, **fields: object) -> None:
        """A save() that alters what is due: settle up to now under the old state, move the mark."""
        self.settle(self.now, self.state, record_only=stops)
        self.mark = self.now
        revision = self.state.revision + 1
        self.states.append(replace(self.state, since=self.now, revision=revision, **fields))

    # -- what happens ---------------------------------------------------------------------------

    misfire = "fire_once"

    @rule(policy=st.sampled_from(["fire_once", "skip", "run_all"]))
    def choose_policy(self, policy: str) -> None:
        self.misfire = policy

    @rule(seconds=st.integers(1, 8), busy=st.booleans())
    def time_passes(self, seconds: int, busy: bool) -> None:
        """The nodes claim what falls due, unless they are down or too busy to be in time."""
        start, self.now = self.now, self.now + seconds * SECOND
        for key, (state, _) in list(self.rows.items()):
            if state == "pending" and self.up:
                self.rows[key] = ("succeeded", self.now)  # a node took and ran the catch-up
        if not self.up or busy:
            self.collected = self.now
            return
        at = self.plan().next_after(max(self.collected, start - GRACE))
        while at is not None and at <= self.now:
            if self.claim(at) == "changed":  # planned from an older revision: re-plan at once
                self.nodes_replan(refused=at)
            else:
                self.collected = at
            at = self.plan().next_after(self.collected)
        self.collected = self.now

    def plan(self) -> Every:
        return Every(self.node_copy.interval * SECOND, anchor=datetime(1970, 1, 1, tzinfo=UTC))

    def claim(self, at: datetime) -> str:
        """A node's claim at ``at``, refused by the gate as the CLAIM_INSERT join refuses it."""
        state = self.state
        if not state.enabled or (state.paused_until and state.paused_until > at):
            return "refused"
        claim = Claim(1, occurrence_key(at), at, slot=True, revision=self.node_copy.revision)
        if slot_refused(self.definition(), claim):
            return "changed" if claim.revision != state.revision else "refused"
        self.decide(occurrence_key(at), "succeeded", at)
        return "won"

    @rule()
    def nodes_replan(self, refused: datetime | None = None) -> None:
        """A heartbeat noticed the change (or a claim was refused as planned from an older
        revision): plan from the later of the mark and what was collected, as Node.reload does."""
        if refused is not None:
            self.collected = min(self.collected, refused - timedelta(microseconds=1))
        self.node_copy = self.state
        self.collected = max(self.mark, self.collected)

    @precondition(lambda self: self.up)
    @rule()
    def leader_pass(self) -> None:
        self.settle(self.now - GRACE - BEAT, self.state)

    @rule()
    def outage(self) -> None:
        self.up = False

    @rule()
    def recover(self) -> None:
        """Nodes start again and plan from their start: the outage is the leader's to settle."""
        self.up, self.collected = True, self.now

    @rule(seconds=st.one_of(st.none(), st.integers(1, 20)))
    def pause(self, seconds: int | None) -> None:
        until = FOREVER if seconds is None else self.now + seconds * SECOND
        self.change(stops=True, paused_until=until)

    @rule()
    def resume(self) -> None:
        if self.state.paused_until is not None:
            self.change(paused_until=None)

    @rule(enabled=st.booleans())
    def set_enabled(self, enabled: bool) -> None:
        if self.state.enabled != enabled:
            self.change(stops=not enabled, enabled=enabled)

    @rule(interval=st.sampled_from([1, 2, 3]))
    def edit(self, interval: int) -> None:
        if self.state.interval != interval:
            self.change(interval=interval)

    @rule(keep=st.integers(0, 30))
    def purge(self, keep: int) -> None:
        """The leader's purge: finished rows that ended before ``keep`` ago, at or before the
        mark (OwnershipMixin.purge)."""
        old = self.now - keep * SECOND
        for key, (_, finished) in list(self.rows.items()):
            at = datetime.fromisoformat(key.replace("Z", "+00:00"))
            if finished is not None and finished < old and at <= self.mark:
                del self.rows[key]

    # -- the invariant --------------------------------------------------------------------------

    @invariant()
    def decided_at_most_once(self) -> None:
        assert all(count == 1 for count in self.decided.values()), self.decided.most_common(3)

    @invariant()
    def decided_only_when_due(self) -> None:
        for key in self.decided:
            at = datetime.fromisoformat(key.replace("Z", "+00:00"))
            assert self.governing(at).due(at), f"{key} was decided but not due"

    @invariant()
    def everything_due_up_to_the_mark_is_decided(self) -> None:
        at = T0 + SECOND
        while at <= self.mark:
            if self.governing(at).due(at):
                assert self.decided[occurrence_key(at)] == 1, f"{occurrence_key(at)} undecided"
            at += SECOND

    def governing(self, at: datetime) -> State:
        """The state in effect for an occurrence at ``at``: the last change strictly before it."""
        return [s for s in self.states if s.since < at][-1]


Protocol.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestProtocol = Protocol.TestCase
