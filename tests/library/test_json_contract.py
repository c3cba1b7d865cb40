"""The job JSON contract table of docs/jobs.md ("Jobs: arguments and JSON summaries") stays true: every key each job
prints with `--json` on a small table (top level, and in its per-region, per-index, per-version and health
objects) is in the job's row of the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memwal.cli import main

from support.maintenance import build_table
from support.tables import open_base

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONTRACT = REPO / "docs" / "jobs.md"
# Pages the docs index names that other work in flight adds (issue 34's parallel branches); each leaves this
# set when its page lands. A link to any other missing file fails.
FORTHCOMING = {"safety-merge.md", "merge-apply-inputs.md", "flush.md", "search.md", "search-fts.md"}


def _names(token: str) -> set[str]:
    """`regions[]` -> regions; `table_version_before/after` -> both; other tokens as they are."""
    token = token.removesuffix("[]")
    head, *alts = token.split("/")
    prefix = head.rsplit("_", 1)[0]
    return {head, *(f"{prefix}_{alt}" for alt in alts)}


def documented_keys(cell: str) -> dict[str | None, set[str]]:
    """The backticked names of one row's cell: None -> the top-level keys; a key -> the names listed in the
    parentheses right after it (its objects' keys). `x_*` stands for every key starting with `x_`."""
    out: dict[str | None, set[str]] = {None: set()}
    owners: list[str | None] = [None]
    last: str | None = None
    for match in re.finditer(r"`([^`]*)`|\(|\)", cell):
        if match.group(0) == "(":
            owners.append(last)
        elif match.group(0) == ")":
            owners.pop()
        else:
            names = _names(match.group(1))
            for name in names:
                out.setdefault(owners[-1], set()).add(name)
            last = match.group(1).removesuffix("[]").split("/")[0]
    return out


def contract_table() -> dict[str, dict[str | None, set[str]]]:
    """job -> documented_keys of its row in the `| job | summary keys |` table of docs/jobs.md."""
    lines = CONTRACT.read_text().splitlines()
    start = lines.index("| job | summary keys |")
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        job, keys = (c.strip() for c in line.strip("|").split("|", 1))
        rows[job] = documented_keys(keys)
    return rows


def _undocumented(keys, allowed: set[str]) -> list[str]:
    wild = [a[:-1] for a in allowed if a.endswith("*")]
    return sorted(k for k in keys if k not in allowed and not any(k.startswith(w) for w in wild))


def test_the_parser_reads_nested_and_abbreviated_keys():
    keys = documented_keys("`job`, `table_version_before/after`, `unmerged_*`, `regions[]` (`region_id`, "
                           "`actions[]` (`kind`), `error`), `storage` (`inline`/`external`), `duration_s`")
    assert keys[None] == {"job", "table_version_before", "table_version_after", "unmerged_*", "regions", "storage",
                          "duration_s"}
    assert keys["regions"] == {"region_id", "actions", "error"} and keys["actions"] == {"kind"}
    assert _undocumented(["unmerged_rows", "nope"], keys[None]) == ["nope"]


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, list[dict]]:
    """Each job's `--json` summaries on a small table with a maintained index, in the maintenance DAG's order
    (status before and after; GC as a dry run and for real)."""
    from support.locations import Location

    loc = Location("local", str(tmp_path_factory.mktemp("contract") / "table"), None)
    build_table(loc, regions=2, generations=3)
    open_base(loc).create_scalar_index("name", "BTREE", name="name_idx")
    runs = [["status"], ["merge"], ["catchup"], ["compaction", "--force"], ["retention", "--older-than-s", "0",
            "--keep-versions", "1"], ["snapshot"], ["gc", "--dry-run"], ["gc"], ["status"]]
    out: dict[str, list[dict]] = {}
    import contextlib
    import io

    for args in runs:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main([args[0], loc.uri, "--json", *args[1:]])
        assert code == 0, f"memwal {' '.join(args)} exited {code}"
        out.setdefault(args[0], []).append(json.loads(buf.getvalue().strip().splitlines()[-1]))
    return out


@pytest.mark.parametrize("job", ["status", "merge", "catchup", "snapshot", "gc", "compaction", "retention"])
def test_every_key_a_job_prints_is_in_the_readme_table(printed, job):
    table = contract_table()
    assert job in table, f"docs/jobs.md's JSON contract table has no row for {job}"
    doc = table[job]
    for summary in printed[job]:
        assert _undocumented(summary, doc[None]) == [], f"{job}: top-level keys missing from docs/jobs.md's table"
        for key in ("regions", "indexes", "versions_sample", "health"):
            items = summary.get(key)
            items = [items] if isinstance(items, dict) else items or []
            for item in items:
                assert key in doc, f"{job}: `{key}` has no documented keys in docs/jobs.md's table"
                assert _undocumented(item, doc[key]) == [], f"{job}: `{key}` keys missing from docs/jobs.md's table"
    nested = {k for k in ("regions", "indexes", "versions_sample", "health") if any(s.get(k) for s in printed[job])}
    expected = {"status": {"regions", "health", "indexes"}, "merge": {"regions"}, "catchup": {"indexes"},
                "snapshot": set(), "gc": {"regions"}, "compaction": set(), "retention": {"versions_sample"}}
    assert nested == expected[job], "the table exercised every nested object the job prints"


def test_readme_links_to_files_that_are_in_the_repository():
    """Every relative link of the README, and every document it cites by name (INTEROP.md), is a file of the
    repository."""
    text = README.read_text()
    repo = README.parent
    links = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
    assert links and all((repo / t).exists() for t in links), [t for t in links if not (repo / t).exists()]
    cited = re.findall(r"[\w/.-]*INTEROP\.md", text)
    assert cited and set(cited) == {"docs/INTEROP.md"} and (repo / "docs/INTEROP.md").is_file()


def test_the_docs_link_to_files_that_are_in_the_repository():
    """Every relative link of every docs/ page is a file of the repository (or a page named in FORTHCOMING)."""
    pages = sorted((REPO / "docs").glob("*.md"))
    assert {"README.md", "airflow.md", "deploying.md", "jobs.md", "library.md", "safety.md", "testing.md"} <= {
        p.name for p in pages}
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" in target or (page.parent / target).exists() or target in FORTHCOMING:
                continue
            missing.append(f"{page.name}: {target}")
    assert missing == [], f"links to files that do not exist: {missing}"


def test_the_readme_stays_short():
    """The README is the front door (what it is, quick start, install, where to read next); the rest is in
    docs/ by audience (issue 34)."""
    lines = len(README.read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: move the detail to a page under docs/"


def test_the_compose_tables_file_says_how_the_demo_table_is_written():
    repo = README.parent
    compose = (repo / "docker-compose.yaml").read_text()
    header = (repo / "docker" / "memwal_tables.yaml").read_text().split("defaults:")[0]
    assert "memwal-demo-table --if-missing" in compose and "memwal-demo-table --if-missing" in header
    assert "airflow-init" in header
