"""Demo data for `make demo`: a bucket-partitioned table written through our writer, and checks.

    python -m memwal.demo write TABLE   base table + MemWAL (4 buckets) + generations with updates/deletes
    python -m memwal.demo verify TABLE  the LSM view equals the model of every write (TABLE.model.json)
    python -m memwal.demo search TABLE  `memwal search` (vector and text) equals a brute-force search of the model

The table carries a vector column `vec` (IVF_FLAT index) and a text column `text` (INVERTED index), both
maintained by the MemWAL, so flushed generations carry them too. A row's `vec` and `text` are functions of its
id and amount (`derived`), so the model of every write (id -> amount) is also the model of what search reads.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from memwal.reader import LsmReader
from memwal.storage import lance_storage_options
from memwal.table_writer import TableWriter
from memwal.writer import WriterConfig

DIM = 8
# Plain English nouns: none is a stop word and no two share a stem, so Lance's analysis keeps each as one term.
WORDS = ("river", "stone", "cloud", "maple", "otter", "falcon", "cedar", "amber", "heron", "coral", "birch", "lynx")
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False, metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("user", pa.string()),
    pa.field("amount", pa.float64()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
    pa.field("text", pa.string()),
])
MAINTAINED = ["user_idx", "vec_idx", "text_idx"]
VECTOR_PARTITIONS = 16  # IVF partitions of the base's vector index: a search probes all of them (exact)
SEARCH_K = 5
TEXT_QUERY = "otter falcon"


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: well-spread 64-bit hashes of integers (vectorised, wraps modulo 2**64)."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def derived(ids: np.ndarray, amounts: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each row's vector (DIM components in [-10, 10], two decimals) and text (2-5 of WORDS), functions of
    its id and amount: every write of a key (a new amount) gets a new vector and text."""
    ids = np.asarray(ids, dtype=np.int64)
    seed = _mix(ids.astype(np.uint64) * np.uint64(1_000_003) + np.rint(np.asarray(amounts) * 10).astype(np.uint64))
    parts = _mix(seed[:, None] * np.uint64(16) + np.arange(16, dtype=np.uint64)[None, :])
    vecs = ((parts[:, :DIM] >> np.uint64(40)) % np.uint64(2001)).astype(np.float32) / 100 - 10
    picks = ((parts[:, DIM:] >> np.uint64(40)) % np.uint64(len(WORDS))).tolist()
    lengths = ((seed >> np.uint64(40)) % np.uint64(4) + np.uint64(2)).tolist()
    texts = [" ".join(WORDS[w] for w in row[:n]) for row, n in zip(picks, lengths, strict=True)]
    return vecs.astype(np.float32), texts


def rows(ids: np.ndarray, version: int) -> pa.Table:
    """The demo's rows for `ids` at write number `version` (amount = id % 1000 + version / 10; vec and text
    derived from id and amount)."""
    amounts = (ids % 1000).astype(np.float64) + version / 10
    vecs, texts = derived(ids, amounts)
    return pa.table({"id": ids, "user": [f"user-{i % 97}" for i in ids], "amount": amounts,
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel(), pa.float32()), DIM),
                     "text": texts}, schema=SCHEMA)


def write_batches(table: str, model: dict[int, float], rng: np.random.Generator, batches: int, batch_rows: int,
                  first_version: int, id_space: int, storage_options: dict[str, str] | None = None) -> None:
    """Upsert batches of random ids (and delete a twentieth of each) through the writer; the model follows."""
    config = WriterConfig(max_memtable_rows=batch_rows // 2, max_flush_interval_s=None)
    with TableWriter(table, storage_options=storage_options, config=config) as writer:
        for b in range(batches):
            ids = rng.choice(id_space, size=batch_rows, replace=False)
            t = rows(ids, first_version + b)
            writer.put(t)
            model.update(zip(t.column("id").to_pylist(), t.column("amount").to_pylist(), strict=True))
            dead = rng.choice(ids, size=batch_rows // 20, replace=False)
            writer.delete(pa.table({"id": dead}))
            for i in dead.tolist():
                model.pop(int(i), None)
            print(f"demo: batch {b + 1}/{batches}: {batch_rows} upserts, {len(dead)} deletes", file=sys.stderr)


def write(table: str, base_rows: int, batches: int, batch_rows: int, seed: int,
          storage_options: dict[str, str] | None = None) -> dict[int, float]:
    """The demo table at `table` (base rows; a BTREE index on `user`, an IVF_FLAT index on `vec` and an
    INVERTED index on `text`, all three maintained by a 4-bucket MemWAL; then `batches` of upserts and deletes
    flushed as generations, each with those indexes); returns the model of its rows. Also the compose
    deployment's demo table (docker/write_demo_table.py), on S3 through `storage_options`."""
    rng = np.random.default_rng(seed)
    model = {int(i): float(i % 1000) for i in range(base_rows)}
    ds = lance.write_dataset(rows(np.arange(base_rows), 0), table, mode="create",
                             storage_options=lance_storage_options(storage_options))
    ds.create_scalar_index("user", "BTREE", name="user_idx")
    ds.create_index("vec", "IVF_FLAT", name="vec_idx", num_partitions=min(VECTOR_PARTITIONS, max(1, base_rows // 64)))
    ds.create_scalar_index("text", "INVERTED", name="text_idx")
    ds.initialize_mem_wal(bucket_column="id", num_buckets=4, maintained_indexes=MAINTAINED)
    write_batches(table, model, rng, batches, batch_rows, first_version=1, id_space=base_rows * 2,
                  storage_options=storage_options)
    return model


def verify(table: str, model: dict[int, float]) -> None:
    """The LSM view's rows equal the model: the same keys, amounts, and the vectors and texts derived from them."""
    view = LsmReader(table).scan(columns=["id", "amount", "vec", "text"])
    got = dict(zip(view.column("id").to_pylist(), view.column("amount").to_pylist(), strict=True))
    if got != model:
        missing = set(model) - set(got)
        extra = set(got) - set(model)
        raise SystemExit(f"demo: LSM view differs from the model ({len(missing)} missing, {len(extra)} extra)")
    vecs, texts = derived(view.column("id").to_numpy(), view.column("amount").to_numpy())
    got_vecs = view.column("vec").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    if not np.array_equal(got_vecs, vecs) or view.column("text").to_pylist() != texts:
        raise SystemExit("demo: LSM view's vec or text differs from the model")
    print(f"demo: LSM view matches the model: {len(model)} rows")


def model_path(table: str) -> str:
    """Where `write` keeps the model of a table: beside it, named after it (TABLE.model.json), so that it
    never replaces another file of the table's directory."""
    return os.path.abspath(str(table).rstrip("/")) + ".model.json"


def read_model(table: str) -> dict[int, float]:
    """The model `write` (and scripts/demo_airflow.py's write-more) kept beside the table: id -> amount."""
    with open(model_path(table)) as f:
        return {int(k): v for k, v in json.load(f).items()}


# --- search: `memwal search` against a brute-force search of the model ------------------------------------


def model_distances(model: dict[int, float], q: np.ndarray) -> dict[int, float]:
    """Squared L2 distance (Lance's l2) from q to every live row's vector, in float64."""
    ids = np.fromiter(model, dtype=np.int64, count=len(model))
    vecs, _ = derived(ids, np.array([model[i] for i in ids.tolist()], dtype=np.float64))
    d = ((vecs.astype(np.float64) - q.astype(np.float64)) ** 2).sum(axis=1)
    return dict(zip(ids.tolist(), d.tolist(), strict=True))


def model_bm25(model: dict[int, float], query: str) -> dict[int, float]:
    """Lance's BM25 (k1 1.2, b 0.75) of every live row holding a query term, with the whole view's statistics;
    the demo's texts are WORDS only, each one term."""
    ids = list(model)
    _, texts = derived(np.array(ids, dtype=np.int64), np.array([model[i] for i in ids], dtype=np.float64))
    docs = [Counter(t.split()) for t in texts]
    n = len(docs)
    avg = sum(sum(c.values()) for c in docs) / n
    scores: dict[int, float] = {}
    for term in query.split():
        df = sum(1 for c in docs if term in c)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for key, c in zip(ids, docs, strict=True):
            tf = c.get(term, 0)
            if tf:
                norm = 1.2 * (1 - 0.75 + 0.75 * sum(c.values()) / avg)
                scores[key] = scores.get(key, 0.0) + idf * 2.2 * tf / (tf + norm)
    return scores


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)  # float32 results against float64 model values


def matches_model(found: list[dict[str, Any]], model: dict[int, float], expected: dict[int, float], key: str,
                  k: int, best_first_is_low: bool) -> list[str]:
    """Why the search result differs from the model's top k (empty when it equals it): each row its key's newest
    live version with the model's vector and text, once, its distance or score the model's, and the k best
    values in order (keys tied at the cut may differ)."""
    problems = []
    ids = [r["id"] for r in found]
    if len(set(ids)) != len(ids):
        problems.append(f"a key came back twice: {ids}")
    for r in found:
        i = r["id"]
        if i not in model or r["amount"] != model[i]:
            problems.append(f"id {i}: not its newest live version (amount {r['amount']}, model {model.get(i)})")
            continue
        vecs, texts = derived(np.array([i]), np.array([model[i]]))
        if r["text"] != texts[0] or (r.get("vec") is not None and not np.array_equal(np.float32(r["vec"]), vecs[0])):
            problems.append(f"id {i}: vec or text differs from the model")
        if not _close(r[key], expected[i]):
            problems.append(f"id {i}: {key} {r[key]}, model {expected[i]}")
    want = sorted(expected.values(), reverse=not best_first_is_low)[:k]
    got = [r[key] for r in found]
    if len(got) != len(want) or not all(_close(a, b) for a, b in zip(got, want, strict=False)):
        problems.append(f"{key}s {got}, model's best {want}")
    return problems


def _memwal_search(table: str, args: list[str]) -> tuple[list[dict[str, Any]], str]:
    """Run `memwal search TABLE ARGS --json --plan` (the installed command); its rows and its plan line."""
    exe = Path(sys.executable).with_name("memwal")
    cmd = [str(exe) if exe.exists() else "memwal", "search", table, *args, "--json", "--plan"]
    shown = " ".join(f"'{a}'" if (" " in a or "[" in a) else a for a in ["memwal", *cmd[1:]])
    print(f"$ {shown}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo: memwal search failed (exit {proc.returncode}): {proc.stderr.strip()}")
    found = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    plan = [line for line in proc.stderr.splitlines() if line.startswith("plan:")]
    return found, plan[0] if plan else "plan: (none printed)"


def _show(found: list[dict[str, Any]], key: str, plan: str) -> None:
    for r in found:
        print(f"  id={r['id']}  amount={r['amount']}  text={r['text']!r}  {key}={r[key]:.4f}")
    print(f"  {plan}")


def gap_generations(table: str, index: str) -> int:
    """Generations merged into the base but not yet covered by `index` (index catch-up has not run): the gap."""
    from memwal.status import table_status

    regions = table_status(table).regions
    return sum(max(0, r.merged_generation - r.index_caught_up.get(index, 0)) for r in regions)


def search(table: str, k: int = SEARCH_K) -> bool:
    """`memwal search` for a vector (the newest version of a key the last batch wrote) and for TEXT_QUERY,
    each printed with the CLI's plan and compared with a brute-force search of the model; True if both equal."""
    model = read_model(table)
    gap = {name: gap_generations(table, name) for name in ("vec_idx", "text_idx")}
    print(f"demo: generations merged but not yet in the base's indexes (the gap): {gap['vec_idx']} for vec_idx, "
          f"{gap['text_idx']} for text_idx; a search asks the base through its index (the fragments it covers) "
          "and each gap generation on its own, through its index or, when small, flat (exact)")
    if not all(gap.values()):
        print("demo: no generation sits in the gap: run `search` after merge and before index catch-up")
        return False
    newest = max(model, key=lambda i: (round(model[i] * 10) - i % 1000 * 10, -i))  # last batch, smallest id
    vecs, _ = derived(np.array([newest]), np.array([model[newest]]))
    q = np.array([round(float(x), 2) for x in vecs[0]], dtype=np.float32)  # as the command line gives it
    print(f"demo: vector query: the vector of id {newest}'s newest version (amount {model[newest]}, written by "
          "the last batch: a gap generation holds it), so it comes first at distance 0")
    found, plan = _memwal_search(table, ["--vector", json.dumps([round(float(x), 2) for x in q]), "--k", str(k)])
    _show(found, "_distance", plan)
    problems = [f"vector: {p}" for p in matches_model(found, model, model_distances(model, q), "_distance", k, True)]
    print(f"demo: text query {TEXT_QUERY!r}")
    found, plan = _memwal_search(table, ["--text", TEXT_QUERY, "--k", str(k)])
    _show(found, "_score", plan)
    problems += [f"text: {p}" for p in matches_model(found, model, model_bm25(model, TEXT_QUERY), "_score", k, False)]
    for p in problems:
        print(f"demo: {p}")
    print(f"search results equal the model: {not problems}")
    return not problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memwal.demo")
    p.add_argument("action", choices=["write", "verify", "search"])
    p.add_argument("table")
    p.add_argument("--base-rows", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=9)
    p.add_argument("--batch-rows", type=int, default=2_000)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pylance").setLevel(logging.WARNING)  # lance logs each vector index build at INFO
    if args.action == "write":
        model = write(args.table, args.base_rows, args.batches, args.batch_rows, args.seed)
        with open(model_path(args.table), "w") as f:
            json.dump(model, f)
        verify(args.table, model)
    elif args.action == "search":
        return 0 if search(args.table) else 1
    else:
        verify(args.table, read_model(args.table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
