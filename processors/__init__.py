"""The memory dynamics as deterministic folds over events: no I/O, no clock, no randomness."""

from processors.config import MemoryConfig
from processors.memory import AgentMemory, Step, as_of, evolve
from processors.state import AgentState

__all__ = ["AgentMemory", "AgentState", "MemoryConfig", "Step", "as_of", "evolve"]
