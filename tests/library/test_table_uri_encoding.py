"""Percent-encoded table URIs: one reading (Lance's) everywhere, or a refusal naming the URI and the rule."""

from __future__ import annotations

import dataclasses
import os
import uuid
from urllib.parse import urlparse

import boto3
import pytest

from memwal.errors import BadInputError
from memwal.merge import merge_table
from memwal.storage import ObjectStore, normalize_uri
from memwal.table import MemWalTable

from support.maintenance import write_generations
from support.tables import create_base, open_base, sorted_rows


def _merge_through(loc) -> None:
    """Table: ids 0..9 created by Lance at loc.uri; one region writes id 1 ('g11') and deletes id 3, then
    a merge, all through the same percent-encoded URI."""
    create_base(loc, ids=range(10))
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, str(uuid.uuid4()), [([1], "g1", [3])])
    summary = merge_table(MemWalTable(loc.uri, loc.storage_options))
    assert not summary.failed_regions, summary.regions
    ids = {r["id"]: r["name"] for r in sorted_rows(open_base(loc).to_table())}
    assert ids[1] == "g11" and 3 not in ids, "the merge must reach the table Lance opened at the URI"


def test_normalize_uri_decodes_file_and_s3_uris_as_lance_does_and_keeps_plain_paths_literal(tmp_path):
    assert normalize_uri(f"file://{tmp_path}/a%20b") == f"{tmp_path}/a b"
    assert normalize_uri(f"{tmp_path}/a%20b") == f"{tmp_path}/a%20b", "Lance takes a plain path as written"
    assert normalize_uri("s3://bucket/a%20b/") == "s3://bucket/a b"


def test_a_file_uri_with_an_escape_keeps_the_mem_wal_beside_the_base_table(local_location, tmp_path):
    """Table: created by Lance at file://<tmp>/a%20b, which Lance stores in the directory 'a b'."""
    _merge_through(dataclasses.replace(local_location, uri=f"file://{tmp_path}/a%20b"))
    assert sorted(os.listdir(tmp_path)) == ["a b"], "no second directory 'a%20b' for our own files"
    assert os.path.isdir(tmp_path / "a b" / "_mem_wal"), "the MemWAL must live in the table Lance wrote"


def test_an_s3_uri_with_an_escape_keeps_the_mem_wal_beside_the_base_table(s3_location, s3_endpoint):
    """Table: created by Lance at s3://<bucket>/a%20b, which Lance stores under the prefix 'a b/'."""
    bucket = urlparse(s3_location.uri).netloc
    _merge_through(dataclasses.replace(s3_location, uri=f"s3://{bucket}/a%20b"))
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert {k.split("/")[0] for k in keys} == {"a b"}, "every object of the table under one prefix, Lance's"
    assert any(k.startswith("a b/_mem_wal/") for k in keys)


@pytest.mark.parametrize("uri", ["s3://bucket/100%25", "s3://bucket/100%", "s3://bucket/t?x=1", "file:///tmp/t#x"])
def test_a_uri_lance_would_read_differently_is_refused_naming_it_and_the_rule(uri):
    with pytest.raises(BadInputError, match="table URI") as info:
        ObjectStore(uri)
    assert repr(uri) in str(info.value), "the error names the URI as given"
