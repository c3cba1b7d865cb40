"""How the page writes numbers: bytes in KiB/MiB, ages in s/min/h/d, times in UTC, "-" for none."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["fmt", "fmt_age", "fmt_bytes", "fmt_limit", "fmt_time"]


def fmt_bytes(n: Any) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_age(s: Any) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def fmt_time(d: datetime | None) -> str:
    return d.strftime("%Y-%m-%d %H:%M:%S") if d else "-"


def fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key.endswith("_age_s"):
        return fmt_age(value)
    return str(value)


def fmt_limit(value: float, key: str) -> str:
    """A threshold as the column writes its values (a whole number without ".0")."""
    return fmt(key, int(value) if float(value).is_integer() else value)
