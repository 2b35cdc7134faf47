"""The faust wiring of engram: topics, agents, tables; processors do the deciding."""
