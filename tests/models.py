"""Models of the test app: a table the test jobs write to, so tests can count real effects."""

from django.db import models


class Effect(models.Model):
    """One row per handler execution: which job, which occurrence, on which node."""

    job = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    node = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField(default=1)
    fence = models.BigIntegerField(default=1)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.job} @ {self.key} on {self.node}"
