"""Test helper: where a test table lives (a local path or a moto S3 bucket) and the S3 settings the suite's
moto endpoint takes. Imported by tests/conftest.py's fixtures and by tests that make a second location."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from memwal.storage import ObjectStore


@dataclass(frozen=True)
class Location:
    """Where a test table lives: its URI and the storage options Lance and obstore take."""

    kind: str
    uri: str
    storage_options: dict[str, str] | None

    def store(self) -> ObjectStore:
        return ObjectStore(self.uri, self.storage_options)

    def child(self, name: str) -> Location:
        return Location(self.kind, f"{self.uri.rstrip('/')}/{name}", self.storage_options)


def s3_options(endpoint: str) -> dict[str, str]:
    return {
        "aws_endpoint": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"memwal-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=name)
    return name
