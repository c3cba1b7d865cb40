"""MemWalLagSensor: wait until a table is within its lag thresholds (or until one is breached).

Deferrable (`deferrable=True`, default from Airflow's `[operators] default_deferrable` as providers do): it
pokes once in the worker and, if it has to wait, defers to `MemWalLagTrigger`, so the waiting happens in the
triggerer and holds no worker slot. `deferrable=False` pokes in the worker as a classic sensor (mode poke or
reschedule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.configuration import conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from memwal.airflow.triggers.memwal import WAIT_FOR, MemWalLagTrigger, lag_event_payload, thresholds_of
from memwal.lag import breaches, measure, validate_thresholds

__all__ = ["MemWalLagSensor"]


class MemWalLagSensor(BaseSensorOperator):
    """Waits for a configured table's lag to be within its thresholds (`wait_for="within"`) or to breach one
    (`wait_for="breached"`).

    :param table: name of a table in the tables file (templated)
    :param thresholds: thresholds to use instead of the table's (same keys as the tables file)
    :param wait_for: "within" or "breached"
    :param deferrable: wait in the triggerer rather than in a worker slot (default: Airflow's
        `[operators] default_deferrable`, as providers do)
    """

    template_fields: Sequence[str] = ("table",)
    ui_color = "#d6eaf8"

    def __init__(self, *, table: str, thresholds: Mapping[str, Any] | None = None, wait_for: str = "within",
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 poke_interval: timedelta | float = 60, **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if wait_for not in WAIT_FOR:
            raise ValueError(f"{self.task_id}: wait_for must be one of {', '.join(WAIT_FOR)}, got {wait_for!r}")
        self.table = table
        self.thresholds = None if thresholds is None else validate_thresholds(thresholds, f"{self.task_id} thresholds")
        self.wait_for = wait_for
        self.deferrable = deferrable

    def _config(self) -> tuple[Any, dict[str, float]]:
        from memwal.airflow.config import config_errors_fail, get_table

        with config_errors_fail():  # a bad tables file fails the sensor without a retry
            cfg = get_table(self.table)
        return cfg, (self.thresholds if self.thresholds is not None else thresholds_of(cfg))

    @cached_property
    def hook(self) -> Any:
        """One hook per sensor: pokes in one worker process reuse its opened table (each poke refreshes it)."""
        from memwal.airflow.hooks.memwal import MemWalHook

        return MemWalHook.for_table(self._config()[0])

    def _check(self) -> tuple[bool, dict[str, Any]]:
        cfg, thresholds = self._config()
        summary = measure(self.hook.table(cfg))
        found = breaches(summary, thresholds)
        for b in found:
            self.log.info("table %s: %s", cfg.name, b["message"])
        return bool(found) == (self.wait_for == "breached"), lag_event_payload(cfg.name, summary, found)

    def poke(self, context: Any) -> PokeReturnValue:
        done, payload = self._check()
        return PokeReturnValue(is_done=done, xcom_value=payload if done else None)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        done, payload = self._check()
        if done:
            return payload
        cfg, thresholds = self._config()
        self.log.info("table %s: not %s yet; waiting in the triggerer (poll every %gs)",
                      cfg.name, self.wait_for, self.poke_interval)
        self.defer(
            trigger=MemWalLagTrigger(table=cfg.name, table_uri=cfg.uri, conn_id=cfg.conn_id, thresholds=thresholds,
                                     poll_interval_s=self.poke_interval or 60.0, wait_for=self.wait_for),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: Mapping[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise AirflowException(event.get("message") or f"table {self.table}: lag trigger failed: {event!r}")
        self.log.info("table %s is %s its lag thresholds", event.get("table"),
                      "over" if event.get("breached") else "within")
        return {k: v for k, v in event.items() if k != "status"}
