#!/usr/bin/env bash
# What only a GPU shows, in one device call of at most 8 minutes (docs/gpu.md: the plan).
#
#   bash benchmarks/gpu/gpu_suite.sh OUT                    # the call: wheels; check, train and sample side by
#                                                           # side; then speed_bf16 and speed_fp16, each alone
#   bash benchmarks/gpu/gpu_suite.sh OUT STAGE...           # stages one after another: check train sample
#                                                           # speed_bf16 speed_fp16 sampling compile digits (call:
#                                                           # the whole call; sampling and compile: calls of their own)
#   SUITE_QUICK=1 bash benchmarks/gpu/gpu_suite.sh OUT ...  # the same commands on a CPU, tiny, for the tests
#   SUITE_DRY=1 bash benchmarks/gpu/gpu_suite.sh OUT        # the plan and its time limits, nothing run
#
# The correctness stages share the GPU (none of them times anything), each in a SUITE_WORK folder of its own; the
# speed stages run alone. Every stage has a time limit of its own: past it the stage is ended with its whole
# process group and reported FAILED, and the suite goes on. What comes back (the device tool returns 8 files):
# OUT/gpu.md (machine, versions, the targets PASS/MISS, every table: benchmarks/results/gpu.md's form),
# OUT/summary.md (each stage OK or FAILED, why, seconds), OUT/suite.log (everything printed) and
# OUT/details.tar.gz (train.md, sample.md, each speed stage's speed.md and speed.json, each stage's log).
#
# The device machine lacks jsonargparse (and diffusers, the speed stages' peer): wheels carried in .whl/ are
# installed first (docs/gpu.md says which). A stage that needs a missing one fails and says so; the others run.
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu/gpu_suite.sh OUT [STAGE...] (check train sample speed_bf16 speed_fp16 sampling compile digits, or call)}
shift
cd "$(dirname "$0")/../.."  # the repository root: every path below starts there
quick=${SUITE_QUICK:-0}

side_by_side=() alone=()
(($#)) || set -- call
for stage in "$@"; do
    case "$stage" in
        call) side_by_side+=(check train sample) alone+=(speed_bf16 speed_fp16) ;;
        check|train|sample|speed_bf16|speed_fp16|sampling|compile|digits) alone+=("$stage") ;;
        *) echo "unknown stage $stage: choose from check train sample speed_bf16 speed_fp16 sampling compile digits, or call" >&2
           exit 2 ;;
    esac
done

# Seconds. The call: wheels + the longest side-by-side stage + the speed stages <= 480 (8 minutes).
# Alone on the 2026-11-26 H200: train 72 s, sample 62 s, speed_bf16 123 s, speed_fp16 77 s (before
# --compiled_plainly: one more compile, about 50 s), sampling 71 s. On the 2026-11-27 H200's slower host one
# Inductor compile of the recipe's training graph took 80-95 s: the speed stages compile what the train stage's
# runs as users run them left in Inductor's cache, and one more graph each (the NHWC loop; the plain one).
limits=(wheels 20 check 120 train 120 sample 100 speed_bf16 200 speed_fp16 140 sampling 150 compile 240 digits 210)
[[ "$quick" == 1 ]] && limits=(wheels 60 check 300 train 900 sample 600 speed_bf16 900 speed_fp16 900 sampling 600
                               compile 600 digits 900)
# SUITE_LIMITS="train=200 digits=300" overrides a stage's limit.
for pair in ${SUITE_LIMITS:-}; do limits+=("${pair%%=*}" "${pair#*=}"); done
limit_of() { local i found=; for ((i = 0; i < ${#limits[@]}; i += 2)); do [[ ${limits[i]} == "$1" ]] && found=${limits[i+1]}; done; echo "$found"; }
plan_seconds=$(limit_of wheels) longest=0 plan="wheels ($(limit_of wheels) s)"
if ((${#side_by_side[@]})); then
    plan+=", side by side:"
    for stage in "${side_by_side[@]}"; do
        plan+=" $stage ($(limit_of "$stage") s)"
        (($(limit_of "$stage") > longest)) && longest=$(limit_of "$stage")
    done
fi
plan_seconds=$((plan_seconds + longest))
((${#alone[@]})) && plan+=", then alone:"
for stage in "${alone[@]}"; do plan+=" $stage ($(limit_of "$stage") s)"; plan_seconds=$((plan_seconds + $(limit_of "$stage"))); done
plan+=": at most $plan_seconds s"
if [[ "${SUITE_DRY:-0}" == 1 ]]; then echo "plan: $plan"; exit 0; fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
details="$out/details"  # packed into details.tar.gz at the end

# A stage run on its own into an OUT of an earlier call: its files join the earlier ones.
[[ -f "$out/details.tar.gz" ]] && tar -xzf "$out/details.tar.gz" -C "$out" && rm "$out/details.tar.gz"
mkdir -p "$details/logs"
exec > >(tee -a "$out/suite.log") 2>&1
echo "plan: $plan"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
work_root=${SUITE_WORK:-/tmp/suite_work}  # each stage works in $work_root/<stage>
summary="$out/summary.md"
[[ -f "$summary" ]] || printf '| stage | result | seconds | reason or note |\n| --- | --- | ---: | --- |\n' > "$summary"
note() { echo "| $1 | $2 | $3 | ${4//|//} |"; }

started=$SECONDS
if compgen -G ".whl/*.whl" > /dev/null; then
    if timeout "$(limit_of wheels)" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl; then
        export PYTHONPATH="/tmp/site:$PYTHONPATH"
        note wheels OK $((SECONDS - started)) "$(ls .whl | tr '\n' ' ')" >> "$summary"
    else
        note wheels FAILED $((SECONDS - started)) "pip could not install .whl/*.whl" >> "$summary"
    fi
fi

# 790 TFLOP/s: bf16 matrix products measured on the lent H200 (an 8192-cube matmul); 8,000 images/s: the goal
# for the 35.7M UNet at batch 128 on one such GPU. Sampling speed is the sampling stage's alone.
speed=(python3 benchmarks/speed/speed.py --config configs/cifar10.yaml --synthetic --peak_tflops 790
       --goal_images_per_s 8000 --rounds 3 --steps 30 --no_project --compiled --samplers "" --profile_steps 10)
# Compiling, cold and warm: the recipe's train.py twice over a compile cache of its own (empty, then filled).
compile=(python3 benchmarks/speed/speed.py --config configs/cifar10.yaml --synthetic --no_project --no_diffusers
         --loader_batches 0 --samplers "" --rounds 1 --steps 5 --train_py_steps 20 --cold_compile)
# 50,000 CIFAR-size samples (issue 25's goals: DDIM-50 <= 100 s, DPM-Solver++(2M) SDE-20 <= 40 s): each sampler in
# bf16-mixed, eager and compiled (one graph for the loop's evaluation, CUDA graphs), at batch 500; nothing trained.
sampling=(python3 benchmarks/speed/speed.py --config configs/cifar10.yaml --synthetic --no_project --no_diffusers
          --no_train_py --loader_batches 0 --rounds 1 --steps 10 --warmup 1 --samplers dpmpp_2m_sde:20,ddim:50
          --sampling_precisions bf16-mixed --sampling_compile --sampling_batch 500 --sampling_repeats 2)
after=()  # train.py flags after `--`
if [[ "$quick" == 1 ]]; then
    sampling=("${sampling[@]/500/4}" --quick)
    speed=(python3 benchmarks/speed/speed.py --config configs/cifar10.yaml --synthetic --peak_tflops 790
           --goal_images_per_s 8000 --quick --no_project --compiled --samplers "" --profile_steps 1)
    compile+=(--quick)
    # Batch 2: bf16 is slow on CPUs without bf16 instructions (the tiny UNet's bf16-mixed step on the AVX2 test machine:
    # 0.43 s at batch 8, 0.13 s at 2).
    after=(--data.init_args.batch_size 2 --data.init_args.num_workers 0 --data.init_args.val_from_train 2)
    export OMP_NUM_THREADS=1  # a few cores shared by stages side by side: spinning OpenMP threads stall each other
fi
# train.py variants timed beside the recipe as it is (a process each). A variant whose flags train.py does not
# accept (an option not there yet) is skipped with a note, not a failure: SUITE_VARIANTS="--data.on_device false"
# adds one (variants separated by ';').
variants=("--model.compile_training false" "--model.compile_channels_last true")
IFS=';' read -r -a extra_variants <<< "${SUITE_VARIANTS:-}"
for variant in "${extra_variants[@]}"; do [[ -n "${variant// /}" ]] && variants+=("$variant"); done
variant_flags=()
for variant in "${variants[@]}"; do variant_flags+=(--train_py "$variant"); done

# The tests that mean something only on CUDA (`-k cuda`: skipped or CPU-only elsewhere; the rest ran in CI):
# TF32, the noise's bits, CUDA-event timing, steady-state steps under sync debug mode, the attention's fused
# kernels, the fast path against eager under Inductor; then the dtype policy's casts. On the 2026-11-26 H200 the
# whole files (64 CPU tests) took 245 s beside train and sample: over the stage's limit.
cuda_tests=(tests/core/test_noise.py tests/training/test_speed_options.py tests/training/test_precision.py
            tests/training/test_step_timer.py tests/generation/test_sample_precision.py tests/cli/test_sample_cli.py
            tests/training/test_steady_state.py tests/models/test_models.py tests/training/test_fast_path.py)
# pyproject's addopts start two pytest-xdist workers; the device machine has no pytest-xdist: one process there.
pytest=(python3 -m pytest -o addopts= -q -p no:cacheprovider)
stage_command() {
    case "$1" in
        check)
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || echo "no nvidia-smi"
            # One interpreter for both (an import of torch is seconds of the call); only torch and Lightning must import.
            python3 -c "
import torch, lightning
print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())
try:
    import jsonargparse, diffusers
    print('jsonargparse', jsonargparse.__version__, 'diffusers', diffusers.__version__)
except ImportError as error:
    print(error, '(the speed stages report what fails to import)')" || return 1
            if [[ "$quick" == 1 ]]; then
                "${pytest[@]}" --collect-only -k cuda "${cuda_tests[@]}" | tail -1
            else
                "${pytest[@]}" -k cuda "${cuda_tests[@]}" && "${pytest[@]}" tests/models/test_mixed_precision.py
            fi ;;
        train|sample) python3 benchmarks/gpu/gpu_checks.py "$1" "$details" ;;
        # The recipe as it is (16-mixed): its train.py, the plain loop eager and compiled as fitting compiles it
        # (CUDA graphs), and compiled plainly (default mode: what the CUDA graphs buy).
        speed_fp16) "${speed[@]}" --no_diffusers --loader_batches 0 --compiled_plainly --out "$details/speed_fp16" \
                        -- "${after[@]}" ;;
        # bf16-mixed: train.py as the recipe is and its variants, the plain loop eager, compiled (NCHW) and
        # compiled NHWC, diffusers' UNet2DModel in its plain loop, and the data path alone.
        speed_bf16)
            "${speed[@]}" "${variant_flags[@]}" --compiled_channels_last --out "$details/speed_bf16" \
                -- --trainer.precision bf16-mixed "${after[@]}" ;;
        compile) "${compile[@]}" --out "$details/compile" -- --trainer.precision bf16-mixed "${after[@]}" ;;
        sampling) "${sampling[@]}" --out "$details/sampling" ;;
        digits)
            if [[ "$quick" == 1 ]]; then
                python3 benchmarks/quality/quality.py --only digits --quick --out "$details/digits" --runs "$SUITE_WORK/runs"
            else
                python3 benchmarks/quality/quality.py --only digits --device cuda --out "$details/digits" --runs "$SUITE_WORK/runs"
            fi || return 1
            echo "the CPU table (benchmarks/results/quality.md) beside this GPU's:"
            grep -h "FD 8x8\|train wall" benchmarks/results/quality.md "$details/digits/quality.md" | grep digits ;;
    esac
}
export -f stage_command
export details quick

# run_stage STAGE: the stage under its limit, its output in details/logs/STAGE.log (and on the terminal unless
# SILENT=1); its summary row in details/logs/STAGE.row. timeout runs the stage in a process group of its own and
# ends it whole at the limit (train.py, its DataLoader workers, speed.py's children; gpu_checks.py ends the
# train.py sessions it started itself).
run_stage() {
    local stage=$1 limit log="$details/logs/$1.log" began=$SECONDS code took reason
    limit=$(limit_of "$stage")
    echo "=== $stage (limit $limit s, $(date -u +%H:%M:%S))"
    mkdir -p "$work_root/$stage" 2> /dev/null
    SUITE_WORK="$work_root/$stage" timeout --kill-after=15 "$limit" \
        bash -c "set -o pipefail; $(declare -p speed sampling compile after variant_flags cuda_tests pytest); stage_command $stage" > "$log" 2>&1 &
    local pid=$!
    [[ "${SILENT:-0}" == 1 ]] || tail -n +1 --pid="$pid" -f "$log" &
    wait "$pid"
    code=$?
    # timeout leads a process group of its own (the stage's), and stops waiting once its child has ended. A
    # process that catches SIGTERM outlives that child: pytest did on the 2026-11-26 H200, its test's Trainer
    # took the signal and the tests ran on beside the speed stages. Whatever of the stage is left goes now.
    kill -KILL -- "-$pid" 2> /dev/null
    [[ "${SILENT:-0}" == 1 ]] || wait $!  # tail, to the log's end
    took=$((SECONDS - began))
    if ((code == 0)); then
        note "$stage" OK "$took" "" > "$details/logs/$stage.row"
    elif ((code == 124 || code == 137)); then
        note "$stage" FAILED "$took" "ran past its $limit s limit: ended" > "$details/logs/$stage.row"
    else
        reason=$(grep -E "Error|error:|FAILED|Traceback|not run" "$log" | tail -1)  # a MISS is a figure, not why
        note "$stage" FAILED "$took" "exit status $code: ${reason:-$(grep -v '^\s*$' "$log" | tail -1)}" \
            > "$details/logs/$stage.row"
    fi
    echo "=== $stage: $(cut -d'|' -f3 "$details/logs/$stage.row" | xargs) after $took s"
}

if ((${#side_by_side[@]})); then
    pids=()
    for stage in "${side_by_side[@]}"; do SILENT=1 run_stage "$stage" & pids+=($!); done
    ((${#pids[@]})) && wait "${pids[@]}"  # these alone: a bare wait would wait for the log's tee too
    for stage in "${side_by_side[@]}"; do
        cat "$details/logs/$stage.row" >> "$summary"
        echo "--- $stage, the end of its log (all of it: details/logs/$stage.log)"
        tail -n 25 "$details/logs/$stage.log"
    done
fi
for stage in "${alone[@]}"; do
    run_stage "$stage"
    cat "$details/logs/$stage.row" >> "$summary"
done
echo "=== done ($(date -u +%H:%M:%S), $((SECONDS - started)) s)"

# gpu.md from what the stages left, then everything else into one archive: the device tool returns 8 files.
python3 benchmarks/gpu/gpu_report.py "$out" --seconds $((SECONDS - started)) --plan "$plan" \
    || echo "gpu_report.py failed: OUT/details holds the stages' files"
rm -f "$details"/logs/*.row
tar -czf "$out/details.tar.gz" -C "$out" details && rm -rf "$details"
files=$(find "$out" -type f | wc -l)
((files <= 8)) || note files FAILED 0 "$files files under OUT: the device tool returns 8" >> "$summary"
cat "$summary"
