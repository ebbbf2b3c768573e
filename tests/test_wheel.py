"""specdec as a user installs it: the wheel carries the kernels and the example inputs inside the package, so
`specdec bench --task summarize|transcribe` finds its default --data without this source tree."""

import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built with this environment's setuptools (--no-build-isolation: no network needed), so a broken
    pyproject.toml fails here instead of being skipped."""
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                        str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"cannot build a wheel: {r.stderr.strip().splitlines()[-3:]}"
    return next(out.glob("specdec_cli-*.whl"))


@pytest.mark.slow
def test_wheel_holds_the_package_and_its_example_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("specdec_cli/kernels/exact.py", "specdec_cli/kernels/qmatmul.cpp", "specdec_cli/bench/runners.py",
                 "specdec_cli/options.py",
                 "specdec_cli/examples/articles/bumblebees.txt", "specdec_cli/examples/articles/bumblebees.ref.txt",
                 "specdec_cli/examples/audio/librivox-sense-and-sensibility-0870.wav"):
        assert path in names, path
    assert not any(n.startswith("kernels/") for n in names), "kernels/ must not install as a top-level package"


@pytest.mark.slow
def test_bench_finds_its_default_data_in_an_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import specdec_cli.bench.runners as r; print(r.__file__); "
            "print('\\n'.join(r.data_files('summarize', None) + r.data_files('transcribe', None)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    module, *files = r.stdout.split()
    assert module.startswith(str(site)), "the wheel's copy ran, not the source tree"
    assert files and all(f.startswith(str(site / "specdec_cli" / "examples")) for f in files), files
    assert any(f.endswith("bumblebees.txt") for f in files) and any(f.endswith(".wav") for f in files)
