"""A job as one object: its options are declared once, as fields of its options dataclass (`option`), and
`JobSpec` derives from them the command line (argparse), the argv of a job started as another process
(spark-submit), the Airflow tables file's keys and the options an operator passes.

A field's metadata says how it appears in each format: `check` (the value check every format shares,
`memwal.option_values`), `flag` (its command-line flag, `Flag`), `table` (its tables-file parser, or True:
the check) and `operator` (how an Airflow operator keyword argument overrides it). Adding an option to a
job is one field in its dataclass. Nothing here imports Lance: DAG files read these while they parse.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from memwal.errors import BadInputError

__all__ = ["Flag", "JobSpec", "check_options", "option", "section"]


@dataclass(frozen=True)
class Flag:
    """How one option appears on the command line.

    kind: "value" (`--name VALUE`, parsed by `parse`), "on" (a switch setting True), "off" (a switch setting
    False) or "append" (repeatable; the list becomes the field's value through `collect`, and `words` spells a
    value back as the words after each flag). none_switch: (flag, help) of a switch that sets the field to None
    (listed after the job's other flags). rank: where the flag sits among the job's (lower first; equal ranks
    in declaration order: the options dataclass's fields, then the job's own JobOptions fields).
    """

    name: str
    help: str | None = None
    parse: Callable[[str], Any] | None = None
    kind: str = "value"
    choices: Sequence[str] | None = None
    metavar: str | None = None
    none_switch: tuple[str, str] | None = None
    collect: Callable[[list], Any] | None = None
    words: Callable[[Any], list[str]] | None = None
    rank: int = 0

    @property
    def none_dest(self) -> str:
        return self.none_switch[0].lstrip("-").replace("-", "_") if self.none_switch else ""


def option(default: Any = MISSING, *, default_factory: Any = MISSING, check: Callable[[Any], Any] | None = None,
           flag: Flag | None = None, table: bool | Callable[[Any], Any] = False, table_key: str | None = None,
           operator: str | None = None, job: str | None = None) -> Any:
    """A dataclass field that is a job option: its default, its check and how each format spells it.

    table: True (the tables file takes it, checked by `check`) or its own parser (e.g. a byte size as text);
    table_key: its tables-file name when not the field's; operator: how an operator's keyword argument of
    the field's name overrides the tables file ("int", "flag" or "list"); job: on JobOptions, the job
    whose option it is (a field of an options dataclass belongs to its section's job)."""
    meta = {"check": check, "flag": flag, "table": table, "table_key": table_key, "operator": operator, "job": job}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def section(job: str, factory: Callable[[], Any], *, flat: bool = False) -> Any:
    """A JobOptions field holding one job's options dataclass; the tables file nests its keys under the
    field's name, or (flat) takes them at the table's top level."""
    return field(default_factory=factory, metadata={"section": job, "flat": flat})


def check_options(obj: Any, where: str) -> None:
    """For an options dataclass's __post_init__: every field with a check checked; BadInputError naming
    `where` and the field."""
    for f in fields(obj):
        check = f.metadata.get("check")
        if check is None:
            continue
        try:
            check(getattr(obj, f.name))
        except ValueError as exc:
            raise BadInputError(f"{where} {f.name}: {exc}") from None


def _default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]


@dataclass(frozen=True)
class JobSpec:
    """One job: its options (the JobOptions class, whose fields say which job each belongs to: a `section`
    holding the job's options dataclass, and `option(job=...)` fields of its own) and its `run` (table,
    JobOptions, regions, **hooks) -> JSON-ready summary; its `plan` (table, JobOptions, regions) -> WorkPlan,
    what it would do now from metadata only (memwal.job_plans), from which the engine is chosen."""

    name: str
    options: type
    run: Callable[..., dict[str, Any]] | None = None
    plan: Callable[..., Any] | None = None

    @property
    def section(self) -> str | None:
        """The JobOptions field holding the job's options dataclass (None: the job has none)."""
        return next((f.name for f in fields(self.options) if f.metadata.get("section") == self.name), None)

    @property
    def loose(self) -> tuple[str, ...]:
        """The JobOptions fields of the job outside its options dataclass."""
        return tuple(f.name for f in fields(self.options) if f.metadata.get("job") == self.name)

    @property
    def table_key(self) -> str | None:
        """The tables-file mapping of the job's section (None: its keys sit at the table's top level)."""
        if self.section is None or self.options.__dataclass_fields__[self.section].metadata.get("flat"):
            return None
        return self.section

    @property
    def section_type(self) -> type | None:
        """The job's options dataclass (MergeConfig, GcConfig, ...), or None."""
        if self.section is None:
            return None
        return type(_default(self.options.__dataclass_fields__[self.section]))

    def _declared(self) -> list[tuple[str | None, Field]]:
        """(the section's name, or None for a JobOptions field of the job's own) and each field, as declared."""
        found = [(self.section, f) for f in fields(self.section_type)] if self.section_type is not None else []
        own = self.options.__dataclass_fields__
        return found + [(None, own[name]) for name in self.loose]

    def _fields(self) -> Iterator[tuple[str | None, Field]]:
        """The fields in the order of their flags."""
        yield from sorted(self._declared(),
                          key=lambda pair: pair[1].metadata["flag"].rank if pair[1].metadata.get("flag") else 0)

    # --- the command line ---------------------------------------------------------------------------------

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The job's flags, their defaults from its dataclass."""
        for _, f in self._fields():
            flag: Flag | None = f.metadata.get("flag")
            if flag is None:
                continue
            if flag.kind == "on":
                parser.add_argument(flag.name, dest=f.name, action="store_true", help=flag.help)
            elif flag.kind == "off":
                parser.add_argument(flag.name, dest=f.name, action="store_false", help=flag.help)
            elif flag.kind == "append":
                parser.add_argument(flag.name, dest=f.name, action="append", type=flag.parse, default=None,
                                    metavar=flag.metavar, help=flag.help)
            else:
                parser.add_argument(flag.name, dest=f.name, type=flag.parse, default=_default(f),
                                    choices=flag.choices, metavar=flag.metavar, help=flag.help)
        for _, f in self._fields():
            flag = f.metadata.get("flag")
            if flag is not None and flag.none_switch:
                parser.add_argument(flag.none_switch[0], dest=flag.none_dest, action="store_true",
                                    help=flag.none_switch[1])

    def from_args(self, args: argparse.Namespace) -> Any:
        """The JobOptions of a parsed command line (a flag the parser lacks keeps its default)."""
        section: dict[str, Any] = {}
        loose: dict[str, Any] = {}
        for where, f in self._fields():
            flag: Flag | None = f.metadata.get("flag")
            if flag is None or not hasattr(args, f.name):
                continue
            value = getattr(args, f.name)
            if flag.kind == "append":
                value = (flag.collect or list)(value or [])
            if flag.none_switch and getattr(args, flag.none_dest, False):
                value = None
            (section if where else loose)[f.name] = value
        if self.section_type is not None:
            loose[self.section] = self.section_type(**section)
        return self.options(**loose)

    def argv(self, options: Any) -> list[str]:
        """The job's options that differ from their defaults, as its command line takes them."""
        out: list[str] = []
        for where, f in self._fields():
            flag: Flag | None = f.metadata.get("flag")
            if flag is None:
                continue
            value = getattr(getattr(options, where) if where else options, f.name)
            if flag.kind == "append":
                for word in (flag.words or list)(value):
                    out.extend([flag.name, word])
            elif value is None and flag.none_switch:
                out.append(flag.none_switch[0])
            elif value is None or value == _default(f):
                continue
            elif flag.kind in ("on", "off"):
                out.append(flag.name)
            else:
                out.extend([flag.name, str(value)])
        return out

    # --- the tables file and the operators ----------------------------------------------------------------

    def table_keys(self) -> dict[str, tuple[str | None, str, Callable[[Any], Any]]]:
        """Tables-file key -> (None for the section or the JobOptions field, the field name, its parser)."""
        out = {}
        for where, f in self._declared():
            table = f.metadata.get("table")
            if not table:
                continue
            parse = table if callable(table) else (f.metadata.get("check") or (lambda v: v))
            out[f.metadata.get("table_key") or f.name] = (where, f.name, parse)
        return out

    def operator_fields(self) -> dict[str, str]:
        """The fields an operator's keyword argument of the same name overrides, and how it is read."""
        return {f.name: f.metadata["operator"] for _, f in self._fields() if f.metadata.get("operator")}

    def with_overrides(self, options: Any, overrides: Mapping[str, Any]) -> Any:
        """`options` with the given fields of this job replaced (a None or False override keeps the value)."""
        section: dict[str, Any] = {}
        loose: dict[str, Any] = {}
        for where, f in self._fields():
            value = overrides.get(f.name)
            if value is not None and value is not False:
                (section if where else loose)[f.name] = value
        if section:
            loose[self.section] = replace(getattr(options, self.section), **section)
        return replace(options, **loose) if loose else options
