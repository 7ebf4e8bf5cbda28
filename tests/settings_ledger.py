"""The test settings with the ledger on a database of its own, as docs/howto/databases.md sets it.

``DATABASE_URL`` is the application's database (``default``), ``LEDGER_DATABASE_URL`` the
ledger's (``ledger``); LedgerRouter sends the app's models there. Used by the scheduler
processes of tests/multinode/test_ledger_database.py.
"""

from tests.settings import *  # noqa: F403
from tests.settings import CLUSTER_JOBS, DATABASES, env
from tests.timing import scaled

DATABASES = {**DATABASES, "ledger": env.db("LEDGER_DATABASE_URL")}
for _db in DATABASES.values():
    if _db["ENGINE"].endswith("sqlite3"):
        _db["OPTIONS"] = {
            "timeout": scaled(20),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        }
DATABASE_ROUTERS = ["django_cluster_jobs.routers.LedgerRouter"]
CLUSTER_JOBS = {**CLUSTER_JOBS, "DATABASE": "ledger"}
