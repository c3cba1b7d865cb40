"""Operators: `memwal` (merge, index catch-up, snapshot refresh, GC)."""
