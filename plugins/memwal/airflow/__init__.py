"""The Airflow side of the MemWAL maintenance platform, laid out as an Airflow provider: the tables
configuration (`config`), the `memwal` connection type and hook (`hooks`), operators for the six jobs
(`operators`), the table assets (`assets`) and the plugin class (`plugin`).

`get_provider_info` is what Airflow's providers manager reads through the `apache_airflow_provider`
entry point (pyproject.toml) to offer the `memwal` connection type in the UI. Importing this package
imports nothing from Airflow.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

__all__ = ["DISTRIBUTION", "get_provider_info"]

DISTRIBUTION = "memwal-platform"  # pyproject.toml's [project] name (a third-party provider's own name)


def get_provider_info() -> dict[str, Any]:
    """Provider metadata: the distribution, its version, the `memwal` connection type, its hook and form fields."""
    return {
        "package-name": DISTRIBUTION,
        "name": "MemWAL",
        "description": "Maintenance (merge, index catch-up, snapshot refresh, GC) of Lance MemWAL tables.",
        "versions": [metadata.version(DISTRIBUTION)],
        "connection-types": [
            {
                "hook-class-name": "memwal.airflow.hooks.memwal.MemWalHook",
                "hook-name": "MemWAL table storage",
                "connection-type": "memwal",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port"],
                    "relabeling": {
                        "host": "Endpoint",
                        "login": "Access key id",
                        "password": "Secret access key",
                    },
                    "placeholders": {
                        "host": "http://127.0.0.1:9000 (empty: the store's default endpoint)",
                        "login": "AKIA... (empty: the environment's credentials)",
                        "password": "secret access key",
                        "extra": '{"region": "us-east-1", "allow_http": false, "storage_options": {}}',
                    },
                },
                "conn-fields": {
                    "region": {
                        "label": "Region",
                        "description": "aws_region, e.g. us-east-1",
                        "schema": {"type": ["string", "null"]},
                    },
                    "allow_http": {
                        "label": "Allow plain HTTP",
                        "description": "allow_http: needed for an http:// endpoint (MinIO, moto)",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "storage_options": {
                        "label": "Storage options",
                        "description": "More Lance storage options as a JSON object (non-secret)",
                        "schema": {"type": ["object", "null"]},
                    },
                },
            }
        ],
    }
