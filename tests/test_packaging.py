"""The wheel a pip user installs: built from this checkout, it holds every tracked file of the four
packages (with their data and py.typed markers) and the license, and nothing else. The suite
otherwise imports from the checkout (an editable install), so a package or data file that the
build configuration leaves out would pass every other test (packaging probe)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tenzro_training import __version__

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tenzro_training", "rpc", "storage", "precompile")

pytestmark = pytest.mark.slow


def _source_tree(dest: Path) -> list[str]:
    """Copy what a clone of this working tree holds (tracked files and new ones git does not
    ignore) to ``dest``: a build in the checkout itself would leave build/ there, whose stale
    files setuptools would ship in later wheels."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            capture_output=True, cwd=REPO, check=True).stdout.decode().split("\0")
    files = [name for name in listed if name and (REPO / name).is_file()]  # a deleted, unstaged file is listed too
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    return files


def test_the_wheel_ships_every_tracked_package_file_and_the_license(tmp_path: Path) -> None:
    source = tmp_path / "src"
    files = _source_tree(source)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    [wheel] = tmp_path.glob("tenzro_training-*.whl")
    assert wheel.name.startswith(f"tenzro_training-{__version__}-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {name for name in files if name.split("/", 1)[0] in PACKAGES}
    assert {f"{p}/py.typed" for p in PACKAGES} <= expected
    assert any(name.startswith("tenzro_training/data/") for name in expected)
    dist_info = f"tenzro_training-{__version__}.dist-info"
    shipped = {n for n in names if not n.startswith(dist_info + "/")}
    assert shipped == expected, (sorted(expected - shipped), sorted(shipped - expected))
    assert f"{dist_info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    assert f"Version: {__version__}\n" in metadata and "License-Expression: Apache-2.0\n" in metadata
    assert "Provides-Extra: evm\n" in metadata
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "tenzro = tenzro_training.console:main" in entry_points
