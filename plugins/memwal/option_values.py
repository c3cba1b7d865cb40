"""The one check of the jobs' option values, used by the argparse types of `memwal` and the Spark entry
points, the Airflow tables file and the option dataclasses: a value one accepts, all accept.

Each check takes a typed value and returns it, or raises BadInputError saying what is wrong with it; the
caller names the parameter (argparse: `argument --grace-period-s: ...`; the tables file: the key). Nothing
here imports Lance: DAG files check their settings while they parse.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from memwal.errors import BadInputError

__all__ = [
    "MAX_SECONDS",
    "argument",
    "boolean",
    "byte_size",
    "byte_size_arg",
    "check_fields",
    "count",
    "count_arg",
    "non_negative",
    "non_negative_arg",
    "optional",
    "ratio",
    "ratio_arg",
    "seconds",
    "seconds_arg",
]

# An age or period longer than any table lives; it keeps `now - seconds` a valid date everywhere.
MAX_SECONDS = 100 * 365 * 86400


def count(value: Any, minimum: int = 1) -> int:
    """An integer (not a bool, not a float) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInputError(f"{value!r} is not an integer")
    if value < minimum:
        raise BadInputError(f"{value} is not >= {minimum}")
    return value


def non_negative(value: Any) -> int:
    """An integer >= 0."""
    return count(value, 0)


def boolean(value: Any) -> bool:
    """true or false, as a bool (the tables file's switches: no text, no 0/1)."""
    if not isinstance(value, bool):
        raise BadInputError(f"{value!r} is not true or false")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInputError(f"{value!r} is not a number")
    if not math.isfinite(value):
        raise BadInputError(f"{value} is not a finite number")
    return float(value)


def seconds(value: Any, *, positive: bool = False) -> float:
    """A finite duration in seconds: 0 (or, positive=True, more than 0) up to MAX_SECONDS (100 years)."""
    out = _number(value)
    if out < 0:
        raise BadInputError(f"{value} is negative")
    if positive and out == 0:
        raise BadInputError(f"{value} is not > 0")
    if out > MAX_SECONDS:
        raise BadInputError(f"{value:g} is more than {MAX_SECONDS} seconds (100 years)")
    return out


def ratio(value: Any) -> float:
    """A finite number between 0 and 1."""
    out = _number(value)
    if not 0 <= out <= 1:
        raise BadInputError(f"{value} is not between 0 and 1")
    return out


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def byte_size(value: Any) -> int:
    """Bytes >= 1: an integer, or text such as `536870912`, `512MiB`, `512m`, `1g`, `1GB` (binary units)."""
    if not isinstance(value, str):
        return count(value)
    m = _SIZE.match(value)
    if not m:
        raise BadInputError(f"{value!r} is not a size (e.g. 536870912, 512MiB, 1g)")
    out = int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    if out < 1:
        raise BadInputError(f"{value!r} is not >= 1 byte")
    return out


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The check, with None allowed (not set)."""
    return lambda value: None if value is None else check(value)


def argument(check: Callable[[Any], Any], parse: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse type: the text parsed (int or float), then checked; argparse names the option."""
    noun = "an integer" if parse is int else "a number"

    def parse_text(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        try:
            return check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse_text


count_arg = argument(count)
byte_size_arg = argument(byte_size, str)
non_negative_arg = argument(non_negative)
ratio_arg = argument(ratio, float)
seconds_arg = argument(seconds, float)


def check_fields(obj: Any, where: str, checks: dict[str, Callable[[Any], Any]]) -> None:
    """For a dataclass's __post_init__: each named field checked; BadInputError naming `where` and the field."""
    for name, check in checks.items():
        try:
            check(getattr(obj, name))
        except ValueError as exc:
            raise BadInputError(f"{where} {name}: {exc}") from None
