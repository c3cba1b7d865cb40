import pytest

from memwal.errors import AlreadyExistsError, MemWalError
from memwal.storage import ObjectStore, join_uri, normalize_uri


def test_put_if_not_exists_never_overwrites(location):
    store = location.store()
    store.put_if_not_exists("a/b.bin", b"first")
    with pytest.raises(AlreadyExistsError):
        store.put_if_not_exists("a/b.bin", b"second")
    assert store.get("a/b.bin") == b"first", "a lost create must leave the winner's bytes"


def test_head_list_delete(location):
    store = location.store()
    assert store.head("x/1") is None
    store.put("x/1", b"12")
    store.put("x/sub/2", b"3")
    assert store.head("x/1").size == 2
    assert sorted(m.path for m in store.list("x")) == ["x/1", "x/sub/2"]
    assert store.list_dirs("x") == ["sub"]
    assert [m.path for m in store.list_files("x")] == ["x/1"]
    assert store.delete_prefix("x") == 3
    assert store.list("x") == []
    store.delete("x/1")  # deleting a missing object is fine


def test_get_missing_raises_file_not_found(location):
    with pytest.raises(FileNotFoundError):
        location.store().get("nope")


def test_uri_forms(tmp_path):
    assert normalize_uri(f"file://{tmp_path}/t") == f"{tmp_path}/t"
    assert normalize_uri("s3://b/p/") == "s3://b/p"
    assert join_uri("s3://b/p", "_mem_wal/r") == "s3://b/p/_mem_wal/r"
    with pytest.raises(MemWalError, match="gs"):
        ObjectStore("gs://bucket/t")
