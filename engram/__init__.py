"""engram: an event-sourced memory for AI agents."""

from engram.client import Memory
from engram.errors import BadEvent, EngramError, NotRunning, PublishError, RejectedEvent
from engram.events import make_event
from engram.settings import Settings

__all__ = [
    "BadEvent",
    "EngramError",
    "Memory",
    "NotRunning",
    "PublishError",
    "RejectedEvent",
    "Settings",
    "make_event",
]
