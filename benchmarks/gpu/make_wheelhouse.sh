#!/usr/bin/env bash
# Fills .gpu-wheelhouse/ (git-ignored) with what benchmarks/gpu/check.sh needs on the GPU machine that its
# image lacks: Python 3.12 manylinux x86_64 wheels and the CIFAR-10 dev images. Run it here, from anywhere;
# then carry .gpu-wheelhouse in the device run (docs/performance.md).
#
# The list is the closure of what privfed imports without Ray (`python -X importtime` over every privfed,
# mechanisms and attacks module plus the Flower modules the runtimes use), less the image's packages
# (/work/.library/device/KINDS.md). Versions are the ones privfed is tested with here. grpcio and protobuf
# are in the image, but grpcio-health-checking's generated code refuses an older grpcio and protobuf runtime,
# so they travel too, and typer, which flwr pins below 0.21, at the version privfed's CLI is tested with.
# Left out: Ray, and flwr's other declared needs that nothing privfed runs imports (uv, sqlalchemy, alembic,
# fastapi, starlette, uvicorn, prompt-toolkit, tomli, tomli-w): the install is --no-deps.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${WHEELHOUSE:-$repo/.gpu-wheelhouse}
data=${DEV_DATA:-$repo/../shared/data/cifar10-dev.npz}
python=${PYTHON:-python3}
max_mib=${MAX_MIB:-40}

WHEELS=(
    flwr==1.41.0
    grpcio==1.85.3
    grpcio-health-checking==1.81.1
    protobuf==6.33.6
    cryptography==50.0.2
    cffi==2.1.1
    pycparser==3.12
    pycryptodome==3.24.1
    iterators==0.0.2
    typer==0.20.1
    opacus==1.6.0
    dp-accounting==0.6.0
    dm-tree==0.1.10
)

rm -rf "$out"
mkdir -p "$out/data"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$out" "${WHEELS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
cp "$data" "$out/data/cifar10-dev.npz"

ls -l "$out"/*.whl | awk '{printf "%8.2f MiB  %s\n", $5 / 1048576, $NF}'
total=$(du -sb "$out" | cut -f1)
printf 'total %.1f MiB in %s (wheels and data; limit %s MiB)\n' "$(echo "$total / 1048576" | bc -l)" "$out" "$max_mib"
if (( total > max_mib * 1048576 )); then
    echo "error: the wheelhouse is over ${max_mib} MiB" >&2
    exit 1
fi
