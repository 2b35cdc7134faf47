"""The memory dynamics as deterministic folds over events: no I/O, no clock, no randomness."""

from processors.config import MemoryConfig
from processors.memory import AgentMemory, AgentState, Step, as_of, evolve

__all__ = ["AgentMemory", "AgentState", "MemoryConfig", "Step", "as_of", "evolve"]
