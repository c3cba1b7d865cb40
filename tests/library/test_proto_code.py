"""The protobuf code checked in under plugins/memwal/_proto (what the wheel ships, so installing it needs no
protoc) is exactly what the pinned grpcio-tools generates from protos/ today: `make proto` after any change."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTOS = REPO / "protos"
CHECKED_IN = REPO / "plugins" / "memwal" / "_proto"


def test_checked_in_protobuf_code_matches_protos(tmp_path):
    from grpc_tools import protoc

    sources = sorted(PROTOS.glob("*.proto"))
    assert sources, "protos/ has no .proto file"
    # grpc_tools' own include dir supplies google/protobuf/*.proto, as `python -m grpc_tools.protoc` does.
    include = Path(protoc.__file__).resolve().parent / "_proto"
    argv = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            *map(str, sources)]
    assert protoc.main(argv) == 0, "protoc failed on protos/"
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated == sorted(f"{s.stem}_pb2{ext}" for s in sources for ext in (".py", ".pyi"))
    for name in generated:
        checked_in = CHECKED_IN / name
        if not checked_in.is_file():
            pytest.fail(f"{checked_in.relative_to(REPO)} is missing: run `make proto` and commit it")
        assert checked_in.read_text() == (tmp_path / name).read_text(), (
            f"{checked_in.relative_to(REPO)} differs from what protoc generates from protos/: run `make proto` "
            "and commit the result")


def test_checked_in_protobuf_code_loads_in_the_pinned_runtime():
    """The gencode's runtime check passes with the pinned protobuf (its version is within the declared range)."""
    from memwal._proto import memwal_pb2

    assert memwal_pb2.RegionManifest.DESCRIPTOR.full_name == "lance.table.RegionManifest"
