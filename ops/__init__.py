"""Running engram: the embedded stack, restore from the archive, benchmarks."""
