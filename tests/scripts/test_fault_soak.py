"""scripts/fault_soak.py at a small size (issue 42): writers, a merge and searches for two cycles through the
fault proxy at the issue's rates, with a lost answer forced on a region manifest, a WAL entry, the lock and a
Lance commit in every cycle: the LSM view equals the model after each cycle, no generation lost or merged twice."""

import fault_soak


def test_two_cycles_through_a_faulty_store_lose_nothing(s3_endpoint):
    report = fault_soak.run(s3_endpoint, cycles=2, regions=2, seed=42)
    assert report.divergences == [] and report.rows_lost == 0, report.to_dict()
    assert report.cycles == 2
    forced_lost = 3 + 2 * 2  # FORCED's, then each region's claim and flush
    assert report.faults["lost"] >= 2 * forced_lost, "the forced lost answers were all injected"
    assert report.faults["503"] >= 2 and report.faults["reset"] >= 2
