#!/usr/bin/env bash
# privfed's GPU check (issues 32 and 43): on the GPU machine, from the repo root, with .gpu-wheelhouse
# carried (make it here with benchmarks/gpu/make_wheelhouse.sh). Installs the wheels with no index, then
# runs benchmarks/gpu/check.py, which writes $OUT/gpu-check.json (./gpu-out without $OUT) and a log per
# part. Everything, the install included, ends within GPU_CHECK_TOTAL_S (540 s; 900 at the toy size) even
# if a part hangs.
#
#   bash benchmarks/gpu/check.sh                                                   # the GPU machine
#   GPU_CHECK_TOY=1 GPU_CHECK_NO_INSTALL=1 PYTHON=/work/venv/bin/python bash benchmarks/gpu/check.sh   # toy, CPU
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
export OUT=${OUT:-$repo/gpu-out}
mkdir -p "$OUT"
python=${PYTHON:-python3}
wheels=${GPU_CHECK_WHEELS:-$repo/.gpu-wheelhouse}
site=${GPU_CHECK_SITE:-/tmp/site}
start=$SECONDS

if [[ -z ${GPU_CHECK_NO_INSTALL:-} ]]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$wheels"/*.whl || { echo "gpu-check: installing the wheels failed" >&2; exit 1; }
    export PYTHONPATH=$site:$repo
    echo "gpu-check: wheels installed in $((SECONDS - start))s"
else
    export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
total=${GPU_CHECK_TOTAL_S:-$([[ ${GPU_CHECK_TOY:-} == 1 ]] && echo 900 || echo 540)}
left=$(( total - (SECONDS - start) - 15 ))  # room for --kill-after
timeout --signal=INT --kill-after=15 "$left" "$python" benchmarks/gpu/check.py --out "$OUT/gpu-check.json" --deadline-s "$left"
