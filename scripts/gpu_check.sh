#!/usr/bin/env bash
# The CUDA checks of the project on a machine with an NVIDIA GPU, section by section:
#
#   bash scripts/gpu_check.sh OUT [policies] [warp] [bench] [train] [sft] [precision]   (none named: the first four)
#
#   policies  the tests marked gpu (tests/test_gpu.py: every policy family samples, scores and
#             fine-tunes on CUDA; bundles move between devices), then bench=policy on CUDA
#   warp      the MuJoCo Warp backend on CUDA: equivalence with the CPU backend, CUDA-graph replay
#             against kernel-by-kernel stepping, the batched ray-traced cameras against OpenGL
#   bench     embodied-bench bench=sim with the mujoco_gpu backend at 256..8192 envs, state-only and
#             one 128x128 camera, task logic on the device and on the host, beside MuJoCo's C batch
#             on this machine's cores
#   train     a short embodied-train run with the worlds (256 MuJoCo Warp envs, cameras ray-traced)
#             and the learner on the GPU (a fresh flow VLA, Flow-SDE PPO, 3 iterations)
#   sft       the main job's SFT stage (flow VLA, 700 steps of 32) on CUDA from the dataset
#             GPU_CHECK_DATA (the main job's data/, collected on any machine); then 100 steps of
#             the same on CUDA and on this machine's CPU cores (one thread per core), for the
#             step-time ratio. Needs no simulator and no Ray.
#   precision the tests marked gpu in tests/policies/test_precision.py (bf16 autocast and frozen weights,
#             torch.compile through Triton, bf16 serving of every family), then benchmarks/precision.py on
#             CUDA from GPU_CHECK_DATA: 300 SFT steps each in fp32, bf16, compiled and bf16 + compiled
#             (steps/s, final loss), the greedy chunk latency in fp32 / bf16 / compiled. Needs no simulator.
#
# The first CUDA use of MuJoCo Warp compiles its kernels (about 4 minutes on an H200 machine with
# an empty ~/.cache/warp), inside whichever of warp / bench / train runs first.
# Each section writes its log (and JUnit XML / JSON) under OUT and the script goes on after a
# failure; the exit status is the number of failed sections. Needs the project's dependencies with
# the extras test and gpu (mujoco-warp, warp-lang; array-api-compat for the task logic on the
# device, a pure-Python wheel); MuJoCo's OpenGL renderer needs EGL (MUJOCO_GL=egl).
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT [policies] [warp] [bench] [train] [sft] [precision]}
shift
sections=${*:-policies warp bench train}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 MUJOCO_GL=${MUJOCO_GL:-egl}
py=${PYTHON:-python3}
failed=0

run() {  # run NAME TIMEOUT_S CMD...: log to OUT/NAME.log, count a failure
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name: $*"
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    tail -n 15 "$out/$name.log"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

"$py" - <<'EOF' | tee "$out/machine.txt"
import torch, platform
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
try:
    import warp, mujoco, mujoco_warp  # noqa: F401
    print("warp", warp.__version__, "mujoco", mujoco.__version__)
except ImportError as err:
    print("no MuJoCo Warp:", err)
EOF

for s in $sections; do
    case $s in
    policies)
        run policies 300 "$py" -m pytest -q -m gpu tests/test_gpu.py --junitxml="$out/policies.xml"
        run policy_bench 150 "$py" -m benchmarks.cli bench=policy "out=$out/policy_bench" device=cuda \
            "batch_sizes=[1,256]" repeats=5 ;;
    warp)
        run warp 480 "$py" -m pytest -q tests/sims/test_warp_backend.py tests/sims/test_warp_render.py \
            -k "not embodied_train and not bench" --junitxml="$out/warp.xml" ;;
    bench)
        # every size twice: task logic on the device, then on host mirrors (the earlier path)
        run bench 500 "$py" -m benchmarks.cli bench=sim "out=$out/bench" "num_envs=[1024]" "num_threads=[16]" \
            "cameras=[]" rollout=false repeats=3 "gpu_backends=[mujoco_gpu]" "gpu_num_envs=[256,1024,8192]" \
            gpu_image_size=128 gpu_steps=20 gpu_repeats=3 "gpu_task_logic=[device,host]" ;;
    train)
        run train 400 "$py" -m embodied.runners.train "out=$out/train" policy=flow suite=goal "tasks=[8]" \
            backend=mujoco_gpu device=cuda num_envs=256 image_size=64 chunks_per_iter=8 max_episode_steps=40 \
            iterations=3 algo=flow_sde algo.minibatch_size=512 runtime.overlap=false ;;
    sft)
        data=${GPU_CHECK_DATA:?section sft: set GPU_CHECK_DATA to a dataset folder, e.g. the main job OUT/data}
        sft=("$py" -m embodied.runners.sft "data=$data" policy=flow batch_size=32 lr=3e-4 warmup_steps=100 seed=0)
        run sft_cuda 200 "${sft[@]}" "out=$out/sft_cuda" steps=700 save_every=250 device=cuda
        run sft_cuda_100 120 "${sft[@]}" "out=$out/sft_cuda_100" steps=100 save_every=100 device=cuda
        run sft_cpu_100 200 env OMP_NUM_THREADS="$(nproc --all)" "${sft[@]}" "out=$out/sft_cpu_100" steps=100 save_every=100 device=cpu ;;
    precision)
        run precision_tests 400 "$py" -m pytest -q -m gpu tests/policies/test_precision.py --junitxml="$out/precision.xml"
        data=${GPU_CHECK_DATA:?section precision: set GPU_CHECK_DATA to a dataset folder, e.g. the main job OUT/data}
        run precision_bench 500 "$py" benchmarks/precision.py "--data=$data" "--out=$out/precision" --device=cuda \
            --threads="$(nproc --all)" --steps=300 --eval-states=0 --variants fp32 bf16 compile bf16_compile ;;
    *)
        echo "unknown section $s (policies warp bench train sft precision)"; failed=$((failed + 1)) ;;
    esac
done
echo "== failed sections: $failed"
exit "$failed"
