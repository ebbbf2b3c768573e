"""`make gpu`, the one command for a GPU machine, runs here in its tiny form (no CUDA): the same code, small
shapes, through the same Makefile route (specdec_cli installed from the tree into build/gpu, python -P), so it
cannot rot."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_make_gpu_runs_every_section_in_its_tiny_form(tmp_path):
    r = subprocess.run(["make", "-s", "gpu", f"GPU_PY={sys.executable}", f"GPU_OUT={tmp_path}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    sections = report["sections"]
    assert list(sections) == ["plans", "rows", "kernels", "graph", "copy", "tests", "grid", "loop"]
    assert report["failed_sections"] == [] and sections["plans"]["skipped"] == sections["rows"]["skipped"] == "no CUDA device"
    assert report["tiny"] and sections["kernels"]["passed"] and sections["tests"]["passed"]
    assert all(run["passed"] for run in sections["kernels"]["runs"])
    modes = sections["loop"]["llama"]["modes"]
    assert all(m["same_as_autoregressive"] for m in modes.values()) and modes["exact"]["verify_share_of_step"] > 0
    assert {r["mode"] for r in sections["grid"]["records"]} >= {"baseline", "exact", "sigmoid", "hf"}
    assert (tmp_path / "synthetic.csv").is_file() and (tmp_path / "log.txt").read_text().count("done in") == 8
