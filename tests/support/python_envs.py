"""A Python like a Spark worker's on a user's cluster: this project's dependencies importable, the project not.

A venv made with `--without-pip` whose site-packages holds one `deps.pth` line naming this venv's
site-packages: a .pth line only adds that directory to sys.path, the .pth files inside it (the editable
install's `__editable__*.pth`, which makes `memwal` importable here) are not processed, so pylance, pyarrow,
pyspark... import there and `memwal` / `spark_jobs` do not (`imports()` is the tests' control).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def python_without_memwal(root: Path) -> Path:
    """The interpreter of a venv at `root` that has this venv's dependencies but not memwal."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def imports(python: Path, module: str, cwd: Path) -> bool:
    """Whether `python` (with no PYTHONPATH, run in `cwd`) can import `module`."""
    proc = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin"})
    return proc.returncode == 0
