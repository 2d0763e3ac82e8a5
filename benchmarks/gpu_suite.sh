#!/usr/bin/env bash
# What only a GPU shows, in stages that each run whatever happened to the ones before (docs/gpu.md: the plan).
#
#   bash benchmarks/gpu_suite.sh OUT STAGE...            # check train sample speed_fp16 speed_bf16
#                                                        # speed_compiled digits, or call1 call2 call3
#   SUITE_QUICK=1 bash benchmarks/gpu_suite.sh OUT ...   # the same commands on a CPU, tiny, for the tests
#
# call1 = check train sample, call2 = speed_fp16 speed_bf16, call3 = speed_compiled digits: one device call
# each, their stages' time limits adding up to under 9 minutes. A stage that fails or runs past its limit is
# ended (its whole process group) and reported FAILED with the reason in OUT/summary.md; the next stage runs.
# OUT/suite.log has everything printed. Files that come back (at most 6 a call, the device tool takes 8):
# summary.md, suite.log, train.md, sample.md, <speed stage>/speed.md and speed.json, digits/quality.md and
# digits/digits_grid.png.
#
# The device machine lacks jsonargparse (and diffusers, the speed stages' peer): wheels carried in .whl/ are
# installed first (docs/gpu.md says which). A stage that needs a missing one fails and says so; the others run.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_suite.sh OUT STAGE... (check train sample speed_fp16 speed_bf16 speed_compiled digits, call1 call2 call3)}
shift
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee -a "$out/suite.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SUITE_WORK=${SUITE_WORK:-/tmp/suite_work}
quick=${SUITE_QUICK:-0}

stages=()
for stage in "$@"; do
    case "$stage" in
        call1) stages+=(check train sample) ;;
        call2) stages+=(speed_fp16 speed_bf16) ;;
        call3) stages+=(speed_compiled digits) ;;
        check|train|sample|speed_fp16|speed_bf16|speed_compiled|digits) stages+=("$stage") ;;
        *) echo "unknown stage $stage: choose from check train sample speed_fp16 speed_bf16 speed_compiled digits, call1 call2 call3" >&2
           exit 2 ;;
    esac
done
((${#stages[@]})) || { echo "no stage given: e.g. call1" >&2; exit 2; }

summary="$out/summary.md"
[[ -f "$summary" ]] || printf '| stage | result | seconds | reason or note |\n| --- | --- | ---: | --- |\n' > "$summary"
note() { echo "| $1 | $2 | $3 | ${4//|//} |" >> "$summary"; }

started=$SECONDS
if compgen -G ".whl/*.whl" > /dev/null; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
        export PYTHONPATH="/tmp/site:$PYTHONPATH"
        note wheels OK $((SECONDS - started)) "$(ls .whl | tr '\n' ' ')"
    else
        note wheels FAILED $((SECONDS - started)) "pip could not install .whl/*.whl"
    fi
fi

# 790 TFLOP/s: bf16 matrix products measured on the lent H200 (an 8192-cube matmul); 8,000 images/s: the goal
# for the 35.7M UNet at batch 128 on one such GPU.
speed=(python3 benchmarks/speed.py --config configs/cifar10.yaml --synthetic --peak_tflops 790
       --goal_images_per_s 8000 --rounds 3 --steps 30)
after=()  # train.py flags after `--`
limits=(check 150 train 250 sample 110 speed_fp16 210 speed_bf16 300 speed_compiled 300 digits 210)
if [[ "$quick" == 1 ]]; then
    speed=(python3 benchmarks/speed.py --config configs/cifar10.yaml --synthetic --quick)
    after=(--data.init_args.num_workers 0 --data.init_args.val_from_train 8)
    limits=(check 300 train 900 sample 600 speed_fp16 900 speed_bf16 900 speed_compiled 900 digits 900)
fi
# SUITE_LIMITS="train=400 digits=300" overrides a stage's limit (seconds).
for pair in ${SUITE_LIMITS:-}; do limits+=("${pair%%=*}" "${pair#*=}"); done
limit_of() { local i found; for ((i = 0; i < ${#limits[@]}; i += 2)); do [[ ${limits[i]} == "$1" ]] && found=${limits[i+1]}; done; echo "$found"; }
logs=$(mktemp -d /tmp/suite_logs.XXXXXX)

cuda_tests=(tests/core/test_noise.py tests/training/test_speed_options.py tests/training/test_precision.py
            tests/training/test_step_timer.py tests/generation/test_sample_precision.py tests/cli/test_sample_cli.py)
stage_command() {
    case "$1" in
        check)
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || echo "no nvidia-smi"
            python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())" || return 1
            python3 -c "import jsonargparse, diffusers; print('jsonargparse', jsonargparse.__version__, 'diffusers', diffusers.__version__)" \
                || echo "(the speed stages report what fails to import)"
            if [[ "$quick" == 1 ]]; then
                python3 -m pytest -q -p no:cacheprovider --collect-only "${cuda_tests[@]}" | tail -1
            else
                python3 -m pytest -q -p no:cacheprovider -m "not slow and not multiprocess" "${cuda_tests[@]}"
            fi ;;
        train|sample) python3 benchmarks/gpu_checks.py "$1" "$out" ;;
        speed_fp16) "${speed[@]}" --samplers "" --out "$out/speed_fp16" -- "${after[@]}" ;;
        speed_bf16)
            "${speed[@]}" --loader_batches 0 --train_py "--trainer.benchmark true" --samplers ddim:50,dpmpp_2m_sde:20 \
                --sampling_precisions 32,bf16-mixed --sampling_batch "$( [[ $quick == 1 ]] && echo 8 || echo 1000 )" \
                --out "$out/speed_bf16" -- --trainer.precision bf16-mixed "${after[@]}" ;;
        speed_compiled)
            "${speed[@]}" --no_diffusers --compiled --loader_batches 0 --samplers "" --out "$out/speed_compiled" \
                -- --trainer.precision bf16-mixed "${after[@]}" ;;
        digits)
            if [[ "$quick" == 1 ]]; then
                python3 benchmarks/quality.py --only digits --quick --out "$out/digits" --runs "$SUITE_WORK/digits_runs"
            else
                python3 benchmarks/quality.py --only digits --device cuda --out "$out/digits" --runs "$SUITE_WORK/digits_runs"
            fi || return 1
            echo "the CPU table (benchmarks/results/quality.md) beside this GPU's:"
            grep -h "FD 8x8\|train wall" benchmarks/results/quality.md "$out/digits/quality.md" | grep digits ;;
    esac
}

for stage in "${stages[@]}"; do
    limit=$(limit_of "$stage")
    echo "=== $stage (limit $limit s, $(date -u +%H:%M:%S))"
    log="$logs/$stage.log"
    began=$SECONDS
    # timeout runs the stage in a process group of its own and ends it whole at the limit (train.py, its
    # DataLoader workers, speed.py's children; gpu_checks.py ends the train.py sessions it started itself).
    export -f stage_command
    export out quick
    timeout --kill-after=15 "$limit" bash -c "$(declare -p speed after cuda_tests); stage_command $stage" 2>&1 \
        | tee "$log"
    code=${PIPESTATUS[0]}
    took=$((SECONDS - began))
    if ((code == 0)); then
        note "$stage" OK "$took" ""
    elif ((code == 124 || code == 137)); then
        note "$stage" FAILED "$took" "ran past its $limit s limit: ended"
    else
        reason=$(grep -E "Error|error:|FAILED|Traceback|MISS|not run" "$log" | tail -1)
        note "$stage" FAILED "$took" "exit status $code: ${reason:-$(grep -v '^\s*$' "$log" | tail -1)}"
    fi
done
echo "=== done ($(date -u +%H:%M:%S), $((SECONDS - started)) s)"
cat "$summary"
