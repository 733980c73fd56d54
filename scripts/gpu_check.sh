#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU and PyTorch but without this project's venv:
# the gpu-marked tests and bench=policy on the GPU. Wheels for what that machine lacks go in
# .whl/ (git-ignored), made on the development machine with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl diffusers==0.42.1 hydra-core==1.3.8 omegaconf==2.3.1
#   .venv/bin/pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
# Results go to ${OUT:-runs/gpu_check}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.txt"
python3 - <<'PY' 2>&1 | tee "$OUT/bench_policy.txt"
import os
from pathlib import Path
from embodied.bench.policy import PolicyBenchConfig, run
out = Path(os.environ["OUT"]) / "bench_cuda"
out.mkdir(parents=True, exist_ok=True)
run(PolicyBenchConfig(out=str(out), device="cuda", batch_sizes=[1, 64, 256], repeats=10), out)
PY
cp "$OUT"/bench_cuda/policy.json "$OUT"/policy_cuda.json 2>/dev/null || true
# MuJoCo Warp on CUDA (issue 9), when its packages are there: the warp physics and renderer tests
# and bench=sim's GPU rows. mujoco and mujoco-warp wheels fit one device call; warp-lang (~149 MB)
# does not fit the 64 MiB a call carries: split it (`split -b 60M`) into ignored folders carried by
# successive calls made while the machine stays warm, then `cat` the parts back into one .whl here
# (a plan, untested: no device was lent so far).
if python3 -c "import mujoco, mujoco_warp, warp" 2>/dev/null; then
  export MUJOCO_GL=egl
  python3 -m pytest -q -p no:cacheprovider tests/test_warp_backend.py tests/test_warp_render.py 2>&1 \
    | tee "$OUT/pytest_warp.txt"
  python3 -m embodied.bench.cli bench=sim out="$OUT/bench_sim" num_envs=[64] repeats=3 \
    gpu_backends=[mujoco_gpu] gpu_num_envs=[256,1024,4096,8192] gpu_image_size=128 2>&1 | tee "$OUT/bench_sim.txt"
else
  echo "mujoco / mujoco_warp / warp not importable: MuJoCo Warp on CUDA not checked" | tee "$OUT/warp_skipped.txt"
fi
