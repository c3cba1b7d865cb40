"""Writer fencing: claim a region by bumping writer_epoch, and check it before every manifest update.

A claim writes manifest version N+1 with writer_epoch + 1 using put-if-not-exists; losing that race
means another writer claimed (or updated) first, so reload and retry. An update by an epoch lower
than the stored one is refused with FencedError (memwal-spec.txt, Writer Fencing, Appendix 1).
"""

from __future__ import annotations

from collections.abc import Callable

from memwal.errors import AlreadyExistsError, CommitConflictError, FencedError, RegionNotFoundError
from memwal.region_manifest import RegionManifest, commit_manifest, load_latest_manifest
from memwal.storage import ObjectStore

__all__ = ["claim_region", "commit_as_writer"]

_MAX_ATTEMPTS = 64


def claim_region(store: ObjectStore, region_id: str, region_spec_id: int = 0) -> RegionManifest:
    """Become the region's writer: a new manifest version with writer_epoch + 1.

    A region with no manifest is created at version 1, epoch 1, current_generation 1. Losing the race for
    the next version (another writer claimed or flushed first) reloads and retries; only a confirmed gap in
    the manifest versions is an error (CorruptFileError, from `load_latest_manifest(refuse_gap=True)`).
    """
    for _ in range(_MAX_ATTEMPTS):
        try:
            current = load_latest_manifest(store, region_id, refuse_gap=True)
            claimed = current.next_version(writer_epoch=current.writer_epoch + 1)
        except RegionNotFoundError:
            claimed = RegionManifest(
                region_id=region_id, version=1, writer_epoch=1, current_generation=1,
                region_spec_id=region_spec_id,
            )
        try:
            return commit_manifest(store, claimed)
        except AlreadyExistsError:
            continue
    raise CommitConflictError(f"could not claim region {region_id} after {_MAX_ATTEMPTS} attempts")


def commit_as_writer(
    store: ObjectStore,
    region_id: str,
    writer_epoch: int,
    update: Callable[[RegionManifest], RegionManifest],
) -> RegionManifest:
    """Commit update(latest) as the next version if writer_epoch still owns the region.

    Raises FencedError as soon as the stored epoch is higher than ours, before writing anything. The latest
    version is probed with refuse_gap: committing into a gap would skip the epoch of the versions above it.
    """
    for _ in range(_MAX_ATTEMPTS):
        current = load_latest_manifest(store, region_id, refuse_gap=True)
        if current.writer_epoch > writer_epoch:
            raise FencedError(region_id, writer_epoch, current.writer_epoch)
        proposed = update(current)
        try:
            return commit_manifest(store, proposed)
        except AlreadyExistsError:
            continue
    raise CommitConflictError(f"manifest update of region {region_id} kept conflicting")
