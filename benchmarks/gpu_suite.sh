#!/usr/bin/env bash
# Issue 9, item 5: what only a GPU shows, in one device call (see docs/DEVELOPING.md "With a GPU").
#
#   bash benchmarks/gpu_suite.sh OUT [STAGE ...]      # stages: check fp16 bf16 compiled nccl sample (default: all)
#
# check     the GPU, torch, and the tests that run only on CUDA (per-sample noise generated on the device, TF32)
# fp16      speed.py on the CIFAR-10 recipe (35.7M UNet, batch 128, its 16-mixed), synthetic images: training
#           images/s of the project, the plain loop and diffusers' UNet2DModel, peak memory, FLOP utilisation,
#           DDIM-50 sampling images/s
# bf16      the same under bf16-mixed (the precision to use on Ampere and newer)
# compiled  bf16-mixed with the plain loop's network compiled beside the eager one, and the compile time
# nccl      train.py --strategy ddp (NCCL) on one GPU for 300 steps of the recipe on generated images
# sample    python -m diffusion.sample from that run's checkpoint: DDIM-50 of 1,024 images in 32-bit and under
#           bf16-mixed (the wall time of each command, model loading included)
#
# Results: OUT/<stage>/speed.md and OUT/suite.log (8 files at most come back from a device call: this writes 4).
# The device machine has no jsonargparse or diffusers: wheels carried in .whl/ (DEVELOPING.md says how) are
# installed first. SUITE_QUICK=1 runs every stage in seconds on a CPU, with a tiny UNet: it checks the flags
# (tests/benchmarks/test_gpu_suite.py), not the speed.
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_suite.sh OUT [check|fp16|bf16|compiled|nccl ...]}
shift
stages=("$@")
((${#stages[@]})) || stages=(check fp16 bf16 compiled nccl sample)
cd "$(dirname "$0")/.."
mkdir -p "$out"
exec > >(tee -a "$out/suite.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi

if [[ "${SUITE_QUICK:-0}" == 1 ]]; then
    speed=(python3 benchmarks/speed.py --config configs/cifar10.yaml --synthetic --quick)
    train_steps=2 images=40 num_samples=8 tiny=(--model.network.init_args.channels 8 --model.network.init_args.channel_mult "[1, 2]"
        --model.network.init_args.num_res_blocks 1 --data.init_args.num_workers 0 --data.init_args.val_from_train 8)
else
    # 989 TFLOP/s: the H100 SXM's (and H200's) dense bf16 peak; speed.py reports the project path's share of it.
    speed=(python3 benchmarks/speed.py --config configs/cifar10.yaml --synthetic --peak_tflops 989 --rounds 4 --steps 30)
    train_steps=300 images=5000 num_samples=1024 tiny=()
fi

for stage in "${stages[@]}"; do
    echo "=== $stage ($(date -u +%H:%M:%S))"
    case "$stage" in
        check)
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"
            python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())"
            python3 -m pytest -q -p no:cacheprovider tests/core/test_noise.py tests/training/test_speed_options.py -k "not benchmark" ;;
        fp16) "${speed[@]}" --out "$out/fp16" ;;
        bf16) "${speed[@]}" --out "$out/bf16" -- --trainer.precision bf16-mixed ;;
        compiled) "${speed[@]}" --out "$out/compiled" --no_diffusers --compiled -- --trainer.precision bf16-mixed ;;
        nccl)
            python3 - "$images" <<'EOF'
import sys
from pathlib import Path

import numpy as np
from PIL import Image

folder, rng = Path("/tmp/suite_images"), np.random.default_rng(0)
folder.mkdir(exist_ok=True)
for i in range(int(sys.argv[1])):
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
EOF
            rm -rf /tmp/suite_runs
            started=$SECONDS
            python3 train.py --config configs/cifar10.yaml --data.init_args.dataset folder \
                --data.init_args.root /tmp/suite_images --data.init_args.image_size 32 "${tiny[@]}" \
                --devices 1 --strategy ddp --max_steps "$train_steps" --trainer.val_check_interval "$train_steps" \
                --sample_grid.num_samples 16 --trainer.logger.init_args.save_dir /tmp/suite_runs \
                --trainer.enable_progress_bar false
            echo "train.py: $train_steps steps in $((SECONDS - started)) s (start-up, one validation and a grid included)"
            ls /tmp/suite_runs/cifar10/version_0/checkpoints ;;
        sample)
            for precision in 32 bf16-mixed; do
                started=$SECONDS
                python3 -m diffusion.sample --ckpt /tmp/suite_runs/cifar10/version_0/checkpoints/last.ckpt \
                    --num_samples "$num_samples" --batch_size 256 --sampler ddim --steps 50 --precision "$precision" \
                    --out "/tmp/suite_samples/$precision" --overwrite
                echo "sample: $num_samples DDIM-50 images under $precision in $((SECONDS - started)) s"
            done ;;
        *) echo "unknown stage $stage: choose from check fp16 bf16 compiled nccl sample" >&2; exit 2 ;;
    esac
done
echo "=== done ($(date -u +%H:%M:%S))"
