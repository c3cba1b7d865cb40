"""Hooks: `memwal` (a MemWAL table: storage options from the connection, status, the six jobs)."""
