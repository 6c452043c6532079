"""The package installs with the C++ package: `cmake --install` puts it under
<prefix>/lib/python3/dist-packages/kvarn, importable from there."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from kvtest import BUILD_DIR


def test_installed_package_imports_from_the_prefix(tmp_path):
    cmake = os.environ.get("KVARN_CMAKE") or shutil.which("cmake")
    if cmake is None or not (BUILD_DIR / "CMakeCache.txt").exists():
        pytest.skip("needs cmake and a configured build directory (KVARN_BUILD_DIR)")
    prefix = tmp_path / "prefix"
    r = subprocess.run([cmake, "--install", str(BUILD_DIR), "--prefix", str(prefix), "--component", "python"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    site = prefix / "lib" / "python3" / "dist-packages"
    installed = sorted(p.name for p in (site / "kvarn").iterdir())
    assert "__init__.py" in installed and "codec.py" in installed and "errors.py" in installed
    assert any(n.startswith("_kvarn.") and n.endswith(".so") for n in installed), installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    code = ("import kvarn, numpy as np; print(kvarn.__file__); "
            "r = kvarn.codec.encode('kvarn_k4v2_g64', np.ones((64, 64)), np.ones((64, 64))); print(r.size)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    path, size = r.stdout.split()
    assert pathlib.Path(path).is_relative_to(site)
    assert int(size) == 3840
