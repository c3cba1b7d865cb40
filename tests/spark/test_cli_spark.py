"""`memwal <job> --spark` runs the job through spark-submit with the same arguments and summary."""

import json

from memwal.cli import main
from memwal.reader import LsmReader

from support.maintenance import build_table
from support.tables import open_base, sorted_rows


def test_memwal_merge_with_spark_matches_the_lsm_view(local_location, capsys):
    loc = local_location
    a, _ = build_table(loc, regions=2, generations=3)
    expected = sorted_rows(LsmReader(loc.uri).scan())
    argv = ["merge", loc.uri, "--spark", "--master", "local[2]", "--region", a, "--up-to-generation", "2", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["spark_master"].startswith("local") and summary["generations_merged"] == 2
    assert summary["regions"][0]["merged_generation_after"] == 2, "--up-to-generation reached the job"
    assert main(["merge", loc.uri, "--spark", "--master", "local[2]"]) == 0
    assert sorted_rows(open_base(loc).to_table()) == expected
