"""Offline replay of captured crawls, and the worker units of `replay --workers N`."""
