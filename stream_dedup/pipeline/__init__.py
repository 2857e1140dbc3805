"""The Deduplicator and its steps: analyse, ask the index in rounds, decide, observe."""
