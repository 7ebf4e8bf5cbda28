"""One job of every kind; each says what it did, so the scheduler's output tells the story.

Every node imports this module, so every node carries every job. Run three nodes and watch: each
cluster-wide occurrence is run by exactly one of them, while startup and every-node jobs run on all.
"""

from datetime import timedelta

from django_cluster_jobs import RunContext, job


@job(name="demo.tick", cron="* * * * * *")
def tick(ctx: RunContext) -> None:
    """Six-field cron, seconds first: every second, run once in the whole cluster."""
    ctx.logger.info("tick: second %s is mine, nobody else runs it", ctx.key)


@job(name="demo.rate", every=timedelta(seconds=5))
def rate(ctx: RunContext) -> None:
    """Fixed rate: a 5-second grid anchored to a shared epoch; every node names the same slots."""
    ctx.logger.info("rate: slot %s (every 5 s on one grid for all nodes)", ctx.key)


@job(name="demo.cooldown", delay=timedelta(seconds=3))
def cooldown(ctx: RunContext) -> None:
    """Fixed delay: the next run is due 3 s after this one finishes, wherever it ran."""
    ctx.logger.info("cooldown: working for 1 s; the next run is due 3 s after I finish")
    ctx.wait(1.0)


@job(name="demo.hello", startup=True)
def hello(ctx: RunContext) -> None:
    """Startup: every node runs it once when its scheduler starts."""
    ctx.logger.info("hello: node %s is up", ctx.node_id)


@job(name="demo.local_housekeeping", every=timedelta(seconds=10), placement="every_node")
def local_housekeeping(ctx: RunContext) -> None:
    """Every node: runs on each node (say, to clear a per-process cache), no claim needed."""
    ctx.logger.info("local housekeeping on %s (runs on every node)", ctx.node_id)
