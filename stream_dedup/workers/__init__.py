"""Worker processes and what they share: the pool, CPUs, heap, shared fingerprints, tables."""
