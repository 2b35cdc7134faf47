"""engram: an event-sourced memory for AI agents.

The public names below are imported when first used (PEP 562), not with the package:
``engram.client`` brings in the fold's modules and every schema, about half a second
of start-up that a command like ``engram --help`` or ``engram sql`` never needs
(every ``engram …`` command imports this package first). ``from engram import
Memory`` works as before.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "Memory": "engram.client",
    "BadEvent": "engram.errors",
    "EngramError": "engram.errors",
    "NotRunning": "engram.errors",
    "PublishError": "engram.errors",
    "RejectedEvent": "engram.errors",
    "make_event": "engram.events",
    "Settings": "engram.settings",
}
"""Each public name's module."""


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'engram' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
