"""Simple SQL filters parsed back into predicates (`col = lit` / `col IN (...)` joined by AND), for region
pruning; the other direction, predicates written as SQL, is `memwal.sql`."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_simple_predicates"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^']|'')*')
      | (?P<num>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)(?![\w.])
      | (?P<qid>"(?:[^"]|"")+"|`[^`]+`)
      | (?P<id>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
      | (?P<op>[=(),])
    )""",
    re.VERBOSE,
)
_MAX_FILTER_LEN = 100_000


def _tokens(sql: str) -> list[tuple[str, Any]] | None:
    out: list[tuple[str, Any]] = []
    pos = 0
    sql = sql.rstrip()
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if not m or m.end() == pos:
            return None
        pos = m.end()
        kind = m.lastgroup
        text = m.group(kind)
        if kind == "str":
            out.append(("lit", text[1:-1].replace("''", "'")))
        elif kind == "num":
            out.append(("lit", int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)))
        elif kind == "qid":
            out.append(("col", text[1:-1].replace('""', '"') if text[0] == '"' else text[1:-1]))
        elif kind == "id":
            up = text.upper()
            out.append(
                ("kw", up)
                if up in ("AND", "IN", "OR", "NOT", "NULL", "TRUE", "FALSE", "IS")
                else ("col", text)
            )
        else:
            out.append(("op", text))
    return out


def parse_simple_predicates(sql_filter: str) -> dict[str, list]:
    """{column: allowed values} for a filter made only of `col = lit` / `col IN (lit, ...)` joined by AND.

    Literals: integers, floats, 'strings' ('' escapes a quote). Anything else (OR, NOT, <, functions,
    NULL, parentheses around clauses, ...) returns {} meaning "no pruning". Repeated columns intersect.
    """
    if not isinstance(sql_filter, str) or len(sql_filter) > _MAX_FILTER_LEN:
        return {}
    toks = _tokens(sql_filter)
    if not toks:
        return {}
    preds: dict[str, list] = {}
    i = 0

    def at(j: int) -> tuple[str, Any]:
        return toks[j] if j < len(toks) else ("end", None)

    while True:
        kind, col = at(i)
        if kind != "col":
            return {}
        if at(i + 1) == ("op", "=") and at(i + 2)[0] == "lit":
            values = [at(i + 2)[1]]
            i += 3
        elif at(i + 1) == ("kw", "IN") and at(i + 2) == ("op", "("):
            values, i = [], i + 3
            while True:
                if at(i)[0] != "lit":
                    return {}
                values.append(at(i)[1])
                if at(i + 1) == ("op", ","):
                    i += 2
                elif at(i + 1) == ("op", ")"):
                    i += 2
                    break
                else:
                    return {}
        else:
            return {}
        unique = list(dict.fromkeys(values))
        preds[col] = [v for v in preds[col] if v in unique] if col in preds else unique
        if at(i)[0] == "end":
            return preds
        if at(i) != ("kw", "AND"):
            return {}
        i += 1
