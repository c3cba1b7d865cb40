"""The one parser of operator arguments that Airflow may hand over as strings.

Operator arguments are typed, but a templated field (a DAG's Params, an upstream XCom) renders to a string:
a list as its JSON or Python text, None as "None". These turn such values back into their types, with an
AirflowFailException naming the parameter when one is not what it should be.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from memwal.job_config import is_true

__all__ = ["flag", "optional_int", "string_list"]

_NONE = ("", "None", "null")


def string_list(name: str, value: Any) -> list[str] | None:
    """A list of strings (a list, its JSON/Python text, or comma-separated); None, empty or "all": None."""
    if isinstance(value, str):
        text = value.strip()
        if text in (*_NONE, "[]", "all"):
            return None
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                value = ast.literal_eval(text)
        else:
            value = [p for p in (s.strip() for s in text.split(",")) if p]
    if value is None:
        return None
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise AirflowFailException(f"{name} must be a list, got {value!r}")
    return [str(v) for v in value] or None


def optional_int(name: str, value: Any) -> int | None:
    """An integer >= 1, or None (None, "", "None", "null")."""
    if value is None or (isinstance(value, str) and value.strip() in _NONE):
        return None
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise AirflowFailException(f"{name} must be an integer, got {value!r}") from None
    if out < 1:
        raise AirflowFailException(f"{name} must be >= 1, got {out}")
    return out


def flag(value: Any) -> bool:
    """A boolean (a bool, or "true"/"1"/"yes" rendered by a template)."""
    return is_true(value)
