"""The runtime of ``manage.py runscheduler``: node loop, executor, heartbeat, leader."""

from .clock import Clock
from .node import Node

__all__ = ["Clock", "Node"]
