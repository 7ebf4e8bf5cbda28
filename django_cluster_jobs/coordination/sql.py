"""Named SQL shared by the PostgreSQL and SQLite fast paths; table names come from model _meta."""

from __future__ import annotations

from ..models import Counter, JobDefinition, JobRun, Lease, RunEvent, WorkerNode

COUNTER = Counter._meta.db_table
NODE = WorkerNode._meta.db_table
LEASE = Lease._meta.db_table
RUN = JobRun._meta.db_table
JOB = JobDefinition._meta.db_table
EVENT = RunEvent._meta.db_table

#: When a claimed run takes its job's lane (see CLAIM_INSERT); mirrored by
#: policies.overlap.takes_lane().
LANED = (
    "d.overlap = 'skip' AND COALESCE(d.max_concurrency, 1) <= 1 AND d.placement = 'cluster' "
    "AND v.outcome IN ('won', 'catch_up', 'external')"
)

#: When a claim of an occurrence of the schedule is refused because it is decided already (at or
#: before the job's mark), was planned from an older revision of the definition, or falls in a
#: pause (before paused_until), see CLAIM_INSERT; mirrored by coordination.orm.slot_refused().
SETTLED = (
    "v.slot AND (v.scheduled_at <= d.settled_through OR v.revision <> d.revision"
    " OR (d.paused_until IS NOT NULL AND v.scheduled_at < d.paused_until))"
)

#: One VALUES row of the batch claim: job_id, key, scheduled_at, outcome, priority, payload, slot,
#: revision.
CLAIM_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s)"

# Batch slot claim. Each VALUES row is one occurrence; the join keeps only enabled, unpaused jobs,
# and refuses occurrences of the schedule (slot) at or before the job's settled_through mark, which
# are decided already (claimed, recorded missed, or not due), even when retention purged their
# rows; the unique (job_id, key) constraint lets exactly one racer insert each row, and RETURNING
# yields exactly what this node won. Scheduled runs of jobs that allow no overlap get lane = job
# id, and the unique index on live_lane (the lane while the run is live, computed by the database)
# lets one live laned run exist per job: a claim that would overlap a run still live anywhere
# conflicts too, which is why ON CONFLICT names no target.
# Parameters: the rows, then node, lease_until, now, now, now.
# The WHERE clause also keeps SQLite from reading ON CONFLICT as the join's ON.
CLAIM_INSERT = f"""
INSERT INTO {RUN} (job_id, key, scheduled_at, due_at, state, outcome, attempt, node,
                   lease_expires_at, fence, priority, payload, error, traceback, reason,
                   cause, cancel_requested, lane, created_at, started_at)
SELECT v.job_id, v.key, v.scheduled_at, v.scheduled_at, 'running', v.outcome, 1, %s,
       %s, 1, v.priority, v.payload, '', '', '', '', false,
       CASE WHEN {LANED} THEN v.job_id END, %s, %s
FROM v
JOIN {JOB} AS d ON d.id = v.job_id AND d.enabled
               AND (d.paused_until IS NULL OR d.paused_until <= %s)
WHERE NOT ({SETTLED})
ON CONFLICT DO NOTHING
RETURNING id, job_id, key
"""

CLAIM_VALUES = (
    "WITH v (job_id, key, scheduled_at, outcome, priority, payload, slot, revision) "
    "AS (VALUES {rows})"
)

# The same rows as one JSON document (PostgreSQL), for large batches: a batch of 1000 is one
# parameter instead of 8000 quoted into the text, and the text is the same for any size.
# Parameters: a JSON array of objects with the eight keys below.
CLAIM_RECORDS = """
WITH v (job_id, key, scheduled_at, outcome, priority, payload, slot, revision) AS (
    SELECT job_id, key, scheduled_at, outcome, priority, payload, slot, revision
    FROM jsonb_to_recordset(%s::jsonb) AS r (job_id bigint, key text, scheduled_at timestamptz,
                                             outcome text, priority integer, payload jsonb,
                                             slot boolean, revision bigint))"""

# PostgreSQL: the claim and the "claimed" timeline entries in one round trip, after CLAIM_VALUES
# or CLAIM_RECORDS. Extra parameters after CLAIM_INSERT's: now, node.
PG_CLAIM_TAIL = f""",
ins AS ({CLAIM_INSERT}),
ev AS (INSERT INTO {EVENT} (run_id, at, kind, node, fence, reason)
       SELECT id, %s, 'claimed', %s, 1, '' FROM ins)
SELECT id, job_id, key FROM ins
"""
PG_CLAIM = CLAIM_VALUES + PG_CLAIM_TAIL
PG_CLAIM_RECORDS = CLAIM_RECORDS + PG_CLAIM_TAIL

# SQLite: the claim alone; its events follow in the same write transaction.
SQLITE_CLAIM = CLAIM_VALUES + "\n" + CLAIM_INSERT

CLAIMED_EVENT = f"""
INSERT INTO {EVENT} (run_id, at, kind, node, fence, reason) VALUES (%s, %s, 'claimed', %s, 1, '')
"""

# What every heartbeat reads besides its writes: the definitions counter, the live nodes (for
# presence and the leader's dead-node chore), the leader lease (so a node tries to lead only when
# it is free) and the earliest run lease expiry (so the leader reaps at that instant, not
# polling). On PostgreSQL these subqueries see the statement's snapshot, from before its writes.
HEARTBEAT_READS = f"""(SELECT value FROM {COUNTER} WHERE name = 'definitions'),
       {{peers}},
       (SELECT {{pair}}(holder, expires_at) FROM {LEASE} WHERE name = 'leader'),
       (SELECT {{expiry}} FROM {RUN} WHERE state = 'running')"""
#: The earliest lease expiry as PostgreSQL reads it: within the instants Python can hold (a
#: lease written as -infinity or infinity would otherwise fail every heartbeat of every node).
#: (GREATEST and LEAST ignore a NULL: with no running run the answer must stay NULL.)
PG_EXPIRY = (
    "CASE WHEN MIN(lease_expires_at) IS NULL THEN NULL ELSE "
    "LEAST(GREATEST(MIN(lease_expires_at), TIMESTAMPTZ '1970-01-01 00:00:00+00'), "
    "TIMESTAMPTZ '9000-01-01 00:00:00+00') END"
)
PG_PEERS = f"""(SELECT json_agg(json_build_array(id, node_id, process, last_heartbeat) ORDER BY id)
        FROM {NODE} WHERE status IN ('active', 'draining'))"""
SQLITE_PEERS = f"""(SELECT json_group_array(json_array(id, node_id, process, last_heartbeat))
        FROM (SELECT id, node_id, process, last_heartbeat FROM {NODE}
              WHERE status IN ('active', 'draining') ORDER BY id))"""

# PostgreSQL heartbeat: node row, every lease of its running runs and, on the leader, the leader
# lease, in one round trip, with the database's clock for the node's offset measurement and
# HEARTBEAT_READS. Parameters: last_heartbeat, clock_offset_ms, claims_won, claims_lost, skipped,
# node, lease_until, node, the ids of the runs the node executes and, in the same order, their
# fences, then leader_until, the leader token (NULL when not leading), now. A run lease is renewed
# only under the fence the node holds; the leader lease only under its token, while unexpired and
# not locked by another transaction (a process frozen mid-chore must not stall the heartbeat:
# the leader thread then renews it, its lock waits bounded).
PG_HEARTBEAT = f"""
WITH n AS (
    UPDATE {NODE} SET last_heartbeat = %s, clock_offset_ms = %s, claims_won = %s,
                      claims_lost = %s, skipped = %s
    WHERE node_id = %s RETURNING status
), r AS (
    UPDATE {RUN} SET lease_expires_at = %s
    WHERE node = %s AND state = 'running'
      AND (id, fence) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))
    RETURNING id, cancel_requested
), l AS (
    UPDATE {LEASE} SET expires_at = %s
    WHERE id IN (SELECT id FROM {LEASE} WHERE name = 'leader' AND token = %s AND expires_at > %s
                 FOR UPDATE SKIP LOCKED)
    RETURNING fence
)
SELECT (SELECT status FROM n), r.id, r.cancel_requested, clock_timestamp(), (SELECT fence FROM l),
       {HEARTBEAT_READS.format(peers=PG_PEERS, pair="json_build_array", expiry=PG_EXPIRY)}
FROM (SELECT 1) AS one LEFT JOIN r ON true
"""

# SQLite heartbeat: the node row, returning its status and HEARTBEAT_READS, in one statement
# (with no run to renew and no leader lease to keep, the whole heartbeat). Parameters:
# last_heartbeat, clock_offset_ms, claims_won, claims_lost, skipped, node.
SQLITE_HEARTBEAT = f"""
UPDATE {NODE} SET last_heartbeat = %s, clock_offset_ms = %s, claims_won = %s,
                  claims_lost = %s, skipped = %s
WHERE node_id = %s
RETURNING status, {HEARTBEAT_READS.format(
    peers=SQLITE_PEERS, pair="json_array", expiry="MIN(lease_expires_at)"
)}
"""

# Renew the leader lease under its token while unexpired. Parameters: leader_until, token, now.
LEADER_RENEW = f"""
UPDATE {LEASE} SET expires_at = %s WHERE name = 'leader' AND token = %s AND expires_at > %s
RETURNING fence
"""

# SQLite: renew the leases of the runs the node executes, each under its fence. Parameters:
# lease_until, node, then (id, fence) of each run.
SQLITE_RENEW = f"""
UPDATE {RUN} SET lease_expires_at = %s
WHERE node = %s AND state = 'running' AND (id, fence) IN (VALUES {{pairs}})
RETURNING id, cancel_requested
"""

# Take due pending runs in rank order (see *_PENDING_ORDER). {lock} is FOR UPDATE SKIP LOCKED on
# PostgreSQL (racers skip each other's rows) and empty on SQLite (its writer lock serialises).
# Parameters: node, lease_until, started_at, now, then the job ids, then those of {order}, then
# the limit.
TAKE_PENDING = f"""
UPDATE {RUN} SET state = 'running', node = %s, fence = fence + 1, lease_expires_at = %s,
                 started_at = %s
WHERE id IN (
    SELECT id FROM {RUN}
    WHERE state = 'pending' AND due_at <= %s AND job_id IN ({{job_ids}})
    ORDER BY {{order}}
    LIMIT %s {{lock}}
)
RETURNING id
"""

# The order of due pending runs with aging: the rank stored with each (ranks.rank_of: due_at -
# priority * PRIORITY_AGING in microseconds, lowest first, the same order as priority + seconds
# overdue / PRIORITY_AGING highest first), then the earliest due, then the oldest. The partial
# index cluster_jobs_run_rank serves it, so a take reads only the rows it takes (and the not yet
# due ones ranked before them), whatever the backlog. No parameters.
RANK_ORDER = "pending_rank, due_at, id"
# Without aging (PRIORITY_AGING None or 0): strict priority order, served by the partial index
# cluster_jobs_run_strict. No parameters.
PRIORITY_ORDER = "priority DESC, due_at, id"

# The timeline entry of each run just taken: a takeover when its previous owner went away (its
# cause, a code: see pending.taken_kind).
TAKEN_EVENTS = f"""
INSERT INTO {EVENT} (run_id, at, kind, node, fence, reason)
SELECT id, %s, CASE WHEN cause IN ('lease_expired', 'handed_back', 'node_lost')
                    THEN 'taken_over' ELSE 'started' END, node, fence, reason
FROM {RUN} WHERE id IN ({{ids}})
"""

# PostgreSQL: the take, its timeline entries and the taken runs in one round trip (TAKE_PENDING,
# TAKEN_EVENTS and the read of the rows, as one statement). Parameters: TAKE_PENDING's, then the
# events' time.
PG_TAKE_PENDING = f"""
WITH t AS ({TAKE_PENDING.replace("RETURNING id", "RETURNING *").strip()}),
ev AS (INSERT INTO {EVENT} (run_id, at, kind, node, fence, reason)
       SELECT id, %s, CASE WHEN cause IN ('lease_expired', 'handed_back', 'node_lost')
                           THEN 'taken_over' ELSE 'started' END, node, fence, reason
       FROM t)
SELECT id, job_id, key, fence, attempt, scheduled_at, payload, due_at, priority FROM t
"""

# PostgreSQL: a run's end and its timeline entry in one statement, committed on its own. The
# UPDATE matches only while the run is running under the writer's fence; when it matches nothing
# the entry says so (fenced_out, with the rejection's reason). Parameters: state, finished_at,
# result, error, traceback, id, fence, then the entry's run id, at, kind, node, fence, reason,
# and the reason when fenced out. Returns whether the end was written.
PG_FINISH = f"""
WITH u AS (
    UPDATE {RUN} SET state = %s, finished_at = %s, result = %s, error = %s, traceback = %s,
                     lease_expires_at = NULL
    WHERE id = %s AND fence = %s AND state = 'running'
    RETURNING id
)
INSERT INTO {EVENT} (run_id, at, kind, node, fence, reason)
SELECT %s, %s, CASE WHEN EXISTS (SELECT 1 FROM u) THEN %s ELSE 'fenced_out' END, %s, %s,
       CASE WHEN EXISTS (SELECT 1 FROM u) THEN %s ELSE %s END
RETURNING kind <> 'fenced_out'
"""

# The planner's estimate of a table's rows, kept by VACUUM, ANALYZE and autovacuum: what a long
# list shows instead of a COUNT(*) of the whole table. Parameter: the table's name.
ROW_ESTIMATE = "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)"
