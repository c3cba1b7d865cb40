from memwal import naming


def test_bit_reversed_name_matches_spec_example():
    """Spec: entry ID 5 (binary ...101) becomes 1010000...0 (64 characters)."""
    assert naming.bit_reversed_name(5) == "101" + "0" * 61


def test_bit_reversed_names_round_trip():
    for n in [0, 1, 2, 3, 4, 5, 1023, 2**40 + 7, 2**64 - 1]:
        assert naming.parse_bit_reversed_name(naming.bit_reversed_name(n) + ".arrow") == n


def test_lance_core_manifest_and_wal_names():
    """Names observed in files written by pylance 14 (INTEROP.md): version 4 -> 0010..., version 1 -> 1000..."""
    region = "4e28f77f-f998-425e-ba42-daca0fd51f29"
    assert naming.manifest_path(region, 4).endswith("/manifest/001" + "0" * 61 + ".binpb")
    assert naming.wal_entry_path(region, 1) == f"_mem_wal/{region}/wal/1{'0' * 63}.arrow"


def test_generation_dir_names_are_fresh_and_parse():
    a, b = naming.new_generation_dir_name(3), naming.new_generation_dir_name(3)
    assert a != b, "a retried flush must get a different directory"
    assert naming.parse_generation_dir_name(a) == 3
    assert naming.parse_generation_dir_name("ba7d56d6_gen_12/") == 12
    assert naming.parse_generation_dir_name("manifest") is None
    assert naming.parse_generation_dir_name("xyz_gen_1") is None
