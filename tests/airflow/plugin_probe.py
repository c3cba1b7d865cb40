"""Load Airflow's plugins (plugins folder: this repository's plugins/) and providers; report as one JSON line:
the plugins, plugin import errors, library modules imported as top-level modules (must be none), and the
`memwal` connection type with its form fields."""

import json
import sys

from airflow import plugins_manager
from airflow.providers_manager import ProvidersManager

LIBRARY_MODULES = ("merge", "storage", "lock", "naming", "writer", "catchup", "snapshot", "wal", "fencing")

plugins, errors = plugins_manager._get_plugins()
pm = ProvidersManager()
hook = pm.hooks.get("memwal")
out = {
    "plugins": [p.name for p in plugins],
    "errors": errors,
    "top_level_library_modules": sorted(m for m in sys.modules if m in LIBRARY_MODULES),
    "hook": hook.hook_class_name if hook else None,
    "widgets": sorted(k for k in pm.connection_form_widgets if "memwal" in k),
    "behaviour": pm.field_behaviours.get("memwal"),
    "fastapi": [a.get("url_prefix") for p in plugins for a in getattr(p, "fastapi_apps", [])],
}
print(json.dumps(out, default=str))
