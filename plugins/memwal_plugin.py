"""Airflow's plugin loader imports this file (and only this one: see .airflowignore) for the MemWAL plugin."""

from memwal.airflow.plugin import MemWalPlugin

__all__ = ["MemWalPlugin"]
