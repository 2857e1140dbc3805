"""The decide step, pure: analyses + what the index answered -> verdicts."""
