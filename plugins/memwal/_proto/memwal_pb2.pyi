from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UUID(_message.Message):
    __slots__ = ("uuid",)
    UUID_FIELD_NUMBER: _ClassVar[int]
    uuid: bytes
    def __init__(self, uuid: _Optional[bytes] = ...) -> None: ...

class FlushedGeneration(_message.Message):
    __slots__ = ("generation", "path")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    generation: int
    path: str
    def __init__(self, generation: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class RegionManifest(_message.Message):
    __slots__ = ("version", "writer_epoch", "replay_after_wal_entry_position", "wal_entry_position_last_seen", "current_generation", "flushed_generations", "region_spec_id", "region_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLAY_AFTER_WAL_ENTRY_POSITION_FIELD_NUMBER: _ClassVar[int]
    WAL_ENTRY_POSITION_LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    CURRENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    REGION_SPEC_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    writer_epoch: int
    replay_after_wal_entry_position: int
    wal_entry_position_last_seen: int
    current_generation: int
    flushed_generations: _containers.RepeatedCompositeFieldContainer[FlushedGeneration]
    region_spec_id: int
    region_id: UUID
    def __init__(self, version: _Optional[int] = ..., writer_epoch: _Optional[int] = ..., replay_after_wal_entry_position: _Optional[int] = ..., wal_entry_position_last_seen: _Optional[int] = ..., current_generation: _Optional[int] = ..., flushed_generations: _Optional[_Iterable[_Union[FlushedGeneration, _Mapping]]] = ..., region_spec_id: _Optional[int] = ..., region_id: _Optional[_Union[UUID, _Mapping]] = ...) -> None: ...

class RegionField(_message.Message):
    __slots__ = ("field_id", "source_ids", "transform", "expression", "result_type", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FIELD_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    RESULT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    field_id: str
    source_ids: _containers.RepeatedScalarFieldContainer[int]
    transform: str
    expression: str
    result_type: str
    parameters: _containers.ScalarMap[str, str]
    def __init__(self, field_id: _Optional[str] = ..., source_ids: _Optional[_Iterable[int]] = ..., transform: _Optional[str] = ..., expression: _Optional[str] = ..., result_type: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegionSpec(_message.Message):
    __slots__ = ("spec_id", "fields")
    SPEC_ID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    spec_id: int
    fields: _containers.RepeatedCompositeFieldContainer[RegionField]
    def __init__(self, spec_id: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[RegionField, _Mapping]]] = ...) -> None: ...

class MergedGeneration(_message.Message):
    __slots__ = ("region_id", "generation")
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    region_id: UUID
    generation: int
    def __init__(self, region_id: _Optional[_Union[UUID, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...

class IndexCatchupProgress(_message.Message):
    __slots__ = ("index_name", "caught_up_generations")
    INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    index_name: str
    caught_up_generations: _containers.RepeatedCompositeFieldContainer[MergedGeneration]
    def __init__(self, index_name: _Optional[str] = ..., caught_up_generations: _Optional[_Iterable[_Union[MergedGeneration, _Mapping]]] = ...) -> None: ...

class MemWalIndexDetails(_message.Message):
    __slots__ = ("snapshot_ts_millis", "num_regions", "inline_snapshots", "region_specs", "maintained_indexes", "merged_generations", "index_catchup", "maintain_all_indexes")
    SNAPSHOT_TS_MILLIS_FIELD_NUMBER: _ClassVar[int]
    NUM_REGIONS_FIELD_NUMBER: _ClassVar[int]
    INLINE_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    REGION_SPECS_FIELD_NUMBER: _ClassVar[int]
    MAINTAINED_INDEXES_FIELD_NUMBER: _ClassVar[int]
    MERGED_GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    INDEX_CATCHUP_FIELD_NUMBER: _ClassVar[int]
    MAINTAIN_ALL_INDEXES_FIELD_NUMBER: _ClassVar[int]
    snapshot_ts_millis: int
    num_regions: int
    inline_snapshots: bytes
    region_specs: _containers.RepeatedCompositeFieldContainer[RegionSpec]
    maintained_indexes: _containers.RepeatedScalarFieldContainer[str]
    merged_generations: _containers.RepeatedCompositeFieldContainer[MergedGeneration]
    index_catchup: _containers.RepeatedCompositeFieldContainer[IndexCatchupProgress]
    maintain_all_indexes: bool
    def __init__(self, snapshot_ts_millis: _Optional[int] = ..., num_regions: _Optional[int] = ..., inline_snapshots: _Optional[bytes] = ..., region_specs: _Optional[_Iterable[_Union[RegionSpec, _Mapping]]] = ..., maintained_indexes: _Optional[_Iterable[str]] = ..., merged_generations: _Optional[_Iterable[_Union[MergedGeneration, _Mapping]]] = ..., index_catchup: _Optional[_Iterable[_Union[IndexCatchupProgress, _Mapping]]] = ..., maintain_all_indexes: _Optional[bool] = ...) -> None: ...

class TableManifest(_message.Message):
    __slots__ = ("version", "index_section")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_SECTION_FIELD_NUMBER: _ClassVar[int]
    version: int
    index_section: int
    def __init__(self, version: _Optional[int] = ..., index_section: _Optional[int] = ...) -> None: ...

class IndexMetadata(_message.Message):
    __slots__ = ("uuid", "fields", "name", "dataset_version", "fragment_bitmap", "index_details")
    UUID_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATASET_VERSION_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_BITMAP_FIELD_NUMBER: _ClassVar[int]
    INDEX_DETAILS_FIELD_NUMBER: _ClassVar[int]
    uuid: UUID
    fields: _containers.RepeatedScalarFieldContainer[int]
    name: str
    dataset_version: int
    fragment_bitmap: bytes
    index_details: _any_pb2.Any
    def __init__(self, uuid: _Optional[_Union[UUID, _Mapping]] = ..., fields: _Optional[_Iterable[int]] = ..., name: _Optional[str] = ..., dataset_version: _Optional[int] = ..., fragment_bitmap: _Optional[bytes] = ..., index_details: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class IndexSection(_message.Message):
    __slots__ = ("indices",)
    INDICES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedCompositeFieldContainer[IndexMetadata]
    def __init__(self, indices: _Optional[_Iterable[_Union[IndexMetadata, _Mapping]]] = ...) -> None: ...
