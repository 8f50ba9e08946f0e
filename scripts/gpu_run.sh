#!/usr/bin/env bash
# Run the GPU tests and the benchmark suite on the GPU machine. See docs/gpu.md.
#
#   scripts/gpu_run.sh                  # default phases: setup tests capture bench overhead
#   scripts/gpu_run.sh modes            # small_ops under reduce-overhead + the graph-break benchmark
#   scripts/gpu_run.sh warm             # cold vs warm start, the warm first call profiled
#   scripts/gpu_run.sh compileprof      # compile time by stage, cold vs warm (compile_profile --warm)
#   scripts/gpu_run.sh targets          # tc cold vs tf cold and warm per row (compile_targets.py; TARGETS_ARGS)
#   scripts/gpu_run.sh tritontimes      # each Triton compile of a row's first call by stage, both compilers (TCT_ARGS)
#   scripts/gpu_run.sh dynamic          # forward workloads static vs dynamic=True
#   scripts/gpu_run.sh gpt2prof         # GPT-2: GPU busy vs wall time, top kernels
#   scripts/gpu_run.sh autotune         # matmul rows under mode="max-autotune", both compilers
#   scripts/gpu_run.sh models           # real transformers models (benchmarks/models.py), all three
#   scripts/gpu_run.sh dist             # DDP on every GPU (torchrun, NCCL): step time and overlap
#   scripts/gpu_run.sh tests bench      # some phases (setup always runs first)
#
# The machine has torch, triton, pytest and friends but no internet and no msgspec, bytecode or
# hatchling: those come as wheels in .whl/ (gitignored; carry it along). Everything is installed
# under $TORCHFUSE_SITE (default /tmp/site), never into the system site-packages.
#
# Environment knobs: OUT (folder collected afterwards: every file is written there as it is
# produced, so a run cut short still leaves its logs; at most 8 files),
# PYTHON, TORCHFUSE_SITE, WHEEL_DIR, FORCE_WHEELS=1 (install the wheels even when the module
# imports), GPU_RUN_BUDGET_S (whole run, default 540), BENCH_ARGS (extra run.py arguments),
# MODELS_ARGS (extra benchmarks/models.py arguments; ";;" separates several runs), MODELS_TIMEOUT_S (the models phase's cap, 420),
# TARGETS_ARGS (benchmarks/compile_targets.py rows, ";;" between runs, a run's leading NAME=VALUE words its environment), TARGETS_TIMEOUT_S (each run's cap, 560),
# TEST_DIRS (the tests phase's folders, default "packages/*/tests tests"), DIST_MODELS (default gpt2; or llama, or "gpt2 llama"), DIST_ARGS (extra benchmarks/distributed.py
# arguments).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2

PY=${PYTHON:-python3}
HAVE_PIP=1
SITE=${TORCHFUSE_SITE:-/tmp/site}
BUILD_SITE="$SITE.build"   # hatchling and its deps: only needed while pip builds our packages
WHEEL_DIR=${WHEEL_DIR:-$ROOT/.whl}
BUDGET=${GPU_RUN_BUDGET_S:-540}
STAMP=$(date -u +%Y%m%d_%H%M)
TAG=gpu_$STAMP
RESULTS=$ROOT/benchmarks/results
OUT_DIR=${OUT:-}
# Where every file of this run is written while it runs: $OUT when set (copied to RESULTS at
# the end), else RESULTS.
DEST=${OUT_DIR:-$RESULTS}
START=$SECONDS
declare -a SUMMARY=()

mkdir -p "$RESULTS" "$DEST"
MAIN_LOG=$DEST/${TAG}_gpu_run.log
TESTS_LOG=$DEST/${TAG}_tests.log
BENCH_LOG=$DEST/${TAG}_bench.log
: >"$MAIN_LOG"

log() { echo "[gpu_run $(date -u +%H:%M:%S)] $*" | tee -a "$MAIN_LOG"; }

# phase_timeout CAP [END]: seconds a step may take: CAP, cut to what is left of the whole budget
# and to the phase's own end time END (in $SECONDS) when given.
phase_timeout() {
    local cap=$1 left=$((BUDGET - (SECONDS - START) - 15))
    ((left < cap)) && cap=$left
    if [[ -n "${2:-}" ]] && (($2 - SECONDS < cap)); then cap=$(($2 - SECONDS)); fi
    echo "$cap"
}

# record NAME RC: remember how a phase ended (124 = killed by its timeout).
record() {
    local what=ok
    case $2 in 0) ;; 124) what="TIMEOUT" ;; skip) what="skipped" ;; *) what="FAILED (rc=$2)" ;; esac
    SUMMARY+=("$1: $what")
    log "phase $1: $what"
}

have_cuda() { "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

have_module() { "$PY" -c "import $1" >/dev/null 2>&1; }

# unpack_wheels DEST FILE...: install wheels without pip (a wheel is a zip of its site-packages
# tree); only used when the machine's python has no pip.
unpack_wheels() {
    local dest=$1 whl; shift
    for whl in "$@"; do "$PY" -m zipfile -e "$whl" "$dest" || return 1; done
}

# install_wheels DEST NAME...: install the wheel of each NAME from $WHEEL_DIR into DEST.
install_wheels() {
    local dest=$1; shift
    local files=() name whl
    for name in "$@"; do
        whl=$(ls "$WHEEL_DIR"/"$name"-*.whl 2>/dev/null | sort -V | tail -n 1)
        if [[ -z "$whl" ]]; then
            log "no wheel for $name in $WHEEL_DIR"
            return 1
        fi
        files+=("$whl")
    done
    ((${#files[@]})) || return 0
    log "installing into $dest: ${files[*]##*/}"
    if ((HAVE_PIP)); then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$dest" "${files[@]}" \
            2>&1 | tee -a "$MAIN_LOG"
        return "${PIPESTATUS[0]}"
    fi
    unpack_wheels "$dest" "${files[@]}"
}

# install_packages: the five packages as real installs (entry points need dist-info metadata).
install_packages() {
    rm -rf "$SITE"/torchfuse "$SITE"/torchfuse_*.dist-info
    if ((HAVE_PIP)); then
        # One pip call for all five: they share the `torchfuse` namespace directory, and
        # pip --target only merges directories it installs together.
        PYTHONPATH="$BUILD_SITE:$PYTHONPATH" "$PY" -m pip install -q --no-index --no-deps \
            --no-build-isolation --no-compile --upgrade --target "$SITE" packages/* 2>&1 | tee -a "$MAIN_LOG"
        return "${PIPESTATUS[0]}"
    fi
    local tmp pkg
    tmp=$(mktemp -d)
    for pkg in packages/*/; do
        (cd "$pkg" && PYTHONPATH="$BUILD_SITE:$PYTHONPATH" "$PY" -m hatchling build -t wheel -d "$tmp") \
            >>"$MAIN_LOG" 2>&1 || return 1
    done
    unpack_wheels "$SITE" "$tmp"/*.whl
}

phase_setup() {
    log "python: $("$PY" -c 'import sys; print(sys.version.split()[0])')"
    mkdir -p "$SITE" "$BUILD_SITE"
    HAVE_PIP=1
    "$PY" -m pip --version >/dev/null 2>&1 || { HAVE_PIP=0; log "no pip: wheels are unpacked directly"; }
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

    # Runtime dependencies the machine lacks (module name, wheel name).
    local missing=() pair
    for pair in msgspec:msgspec bytecode:bytecode safetensors:safetensors; do
        if [[ "${FORCE_WHEELS:-0}" == 1 ]] || ! have_module "${pair%%:*}"; then
            missing+=("${pair#*:}")
        fi
    done
    install_wheels "$SITE" "${missing[@]}" || return 1
    for mod in torch triton sympy networkx numpy pytest; do
        have_module "$mod" || log "WARNING: $mod does not import"
    done

    # Build backend for a real (non-editable) install: entry points need the dist-info metadata.
    if [[ "${FORCE_WHEELS:-0}" == 1 ]] || ! have_module hatchling; then
        install_wheels "$BUILD_SITE" hatchling packaging pathspec pluggy trove_classifiers tomlkit || return 1
    fi
    log "installing packages/* into $SITE"
    if ! install_packages; then
        log "WARNING: package install failed; falling back to packages/*/src on PYTHONPATH" \
            "(no entry points: backends must then be found without metadata)"
        local src
        for src in packages/*/src; do PYTHONPATH="$ROOT/$src:$PYTHONPATH"; done
        export PYTHONPATH
    fi

    "$PY" - <<'EOF' 2>&1 | tee -a "$MAIN_LOG"
import importlib.metadata as md
import platform

def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "missing"

print("python", platform.python_version())
for dist in ("torch", "triton", "transformers", "matplotlib", "numpy", "sympy", "networkx",
             "pytest", "msgspec", "bytecode", "safetensors"):
    print(f"  {dist:<14} {version(dist)}")
for name in ("graph", "capture", "autograd", "inductor", "runtime"):
    print(f"  torchfuse-{name:<8} {version('torchfuse-' + name)}")
eps = md.entry_points(group="torchfuse.backends")
print("  backends:", ", ".join(f"{ep.name}={ep.value}" for ep in eps) or "none")
import torch
print("  cuda", torch.version.cuda, "available:", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi 2>&1 | tee -a "$MAIN_LOG"
    else
        log "nvidia-smi not found"
    fi
}

phase_tests() {
    local t dir rc failed=0 end
    end=$((SECONDS + $(phase_timeout 150)))
    # One pytest per test directory: a collection error in one package must not hide the GPU
    # tests of the others.
    # shellcheck disable=SC2086  # a list of globs on purpose
    for dir in ${TEST_DIRS:-packages/*/tests tests}; do
        [[ -d "$dir" ]] || continue
        t=$(phase_timeout 120 "$end")
        ((t < 20)) && return 124
        log "pytest -m gpu $dir (timeout ${t}s)"
        timeout "$t" "$PY" -m pytest -m gpu -q -p no:cacheprovider "$dir" 2>&1 | tee -a "$TESTS_LOG"
        rc=${PIPESTATUS[0]}
        # 5 = no test selected: nothing there is marked gpu, which is not a failure.
        ((rc == 5)) && rc=0
        ((rc != 0)) && { log "$dir: rc=$rc"; failed=$rc; }
    done
    return "$failed"
}

phase_capture() {
    local t
    t=$(phase_timeout 120)
    ((t < 20)) && return 124
    log "capture tests under $("$PY" -c 'import sys; print(sys.version.split()[0])') bytecode (timeout ${t}s)"
    timeout "$t" "$PY" -m pytest packages/capture/tests -q -p no:cacheprovider 2>&1 | tee -a "$TESTS_LOG"
    return "${PIPESTATUS[0]}"
}

phase_bench() {
    local t hit=90 extra=() rc
    t=$(phase_timeout 330)
    ((t < 60)) && return 124
    if ! have_cuda; then
        log "no CUDA device: benchmark smoke run with tiny shapes on the CPU"
        extra=(--small --device cpu --rep-ms 20)
        hit=60
    fi
    # Stop starting workloads early enough for the cache-hit pass and the report to finish.
    local budget=$((t - hit - 30))
    log "benchmarks/run.py --tag $TAG (timeout ${t}s, workloads started within ${budget}s)"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words on purpose
    timeout "$t" "$PY" benchmarks/run.py --tag "$TAG" --out "$DEST" --budget-s "$budget" \
        --hit-timeout "$hit" "${extra[@]}" ${BENCH_ARGS:-} 2>&1 | tee -a "$BENCH_LOG"
    rc=${PIPESTATUS[0]}
    return "$rc"
}

phase_overhead() {
    local script t rc=0 r args name end
    end=$((SECONDS + $(phase_timeout 120)))
    for script in benchmarks/guard_overhead.py benchmarks/launch_overhead.py; do
        if [[ ! -f "$script" ]]; then
            log "$script not present"
            continue
        fi
        t=$(phase_timeout 90 "$end")
        ((t < 20)) && return 124
        # Pass the options a script declares: a JSON result file, and the CPU when there is no GPU.
        args=()
        name=$(basename "$script" .py)
        grep -q -- '"--json"' "$script" && args+=(--json "$DEST/${name}_$TAG.json")
        if grep -q -- '"--device"' "$script" && ! have_cuda; then args+=(--device cpu); fi
        log "$script ${args[*]} (timeout ${t}s)"
        timeout "$t" "$PY" "$script" "${args[@]}" 2>&1 | tee -a "$BENCH_LOG"
        r=${PIPESTATUS[0]}
        ((r != 0)) && rc=$r
    done
    return "$rc"
}

# Rows in other modes and the graph-break benchmark: results go to the bench log only (the
# run keeps the files it writes under $OUT to eight).
phase_modes() {
    local t rc=0 r
    t=$(phase_timeout 120)
    ((t < 30)) && return 124
    log "benchmarks/run.py --only small_ops --mode reduce-overhead (timeout ${t}s)"
    timeout "$t" "$PY" benchmarks/run.py --only small_ops --mode reduce-overhead --no-cache-hit \
        --no-plot --tag "${TAG}_reduce_overhead" --out /tmp/modes_results 2>&1 | tee -a "$BENCH_LOG"
    r=${PIPESTATUS[0]}; ((r != 0)) && rc=$r
    if [[ -f benchmarks/graph_break.py ]]; then
        t=$(phase_timeout 90)
        ((t < 20)) && return 124
        log "benchmarks/graph_break.py (timeout ${t}s)"
        timeout "$t" "$PY" benchmarks/graph_break.py 2>&1 | tee -a "$BENCH_LOG"
        r=${PIPESTATUS[0]}; ((r != 0)) && rc=$r
    fi
    return "$rc"
}

# Cold vs warm start of torchfuse alone (two fresh processes over one cache), the warm one
# profiled, with the runtime's first-call phase lines.
phase_warm() {
    local t
    t=$(phase_timeout 200)
    ((t < 30)) && return 124
    local dev=cuda
    have_cuda || dev=cpu
    log "benchmarks/warm_start.py (timeout ${t}s)"
    timeout "$t" "$PY" benchmarks/warm_start.py --device "$dev" ${WARM_ARGS:-} \
        --json "$DEST/warm_start_$TAG.json" 2>&1 | tee -a "$BENCH_LOG"
    return "${PIPESTATUS[0]}"
}

# Where compile time goes, cold vs warm, each in fresh processes over one fresh cache
# (benchmarks/compile_profile.py --warm): micro rows and GPT-2 training (Triton compiles in
# worker processes, the default from 4 cores), then GPT-2 training again without them
# (TORCHFUSE_COMPILE_WORKERS=0).
phase_compileprof() {
    local t end rc=0 r dev=cuda extra=()
    have_cuda || { dev=cpu; extra=(--small); }
    end=$((SECONDS + $(phase_timeout 330)))
    local out="$DEST/compile_profile_$TAG.txt"
    for run in "--only ${COMPILEPROF_ONLY:-softmax,cross_entropy,small_ops,layer_norm_train}" \
               "--models gpt2 --model-modes training" "noworkers --models gpt2 --model-modes training"; do
        t=$(phase_timeout 200 "$end")
        ((t < 30)) && return 124
        local env=() args=$run
        if [[ $run == noworkers* ]]; then env=(TORCHFUSE_COMPILE_WORKERS=0); args=${run#noworkers }; fi
        log "compile_profile.py --warm $args ${env[*]} (timeout ${t}s)"
        # shellcheck disable=SC2086  # args is a list of words on purpose
        env "${env[@]}" timeout "$t" "$PY" benchmarks/compile_profile.py --warm --device "$dev" \
            --timeout $((t / 2)) "${extra[@]}" $args 2>&1 | tee -a "$out"
        r=${PIPESTATUS[0]}
        ((r != 0)) && rc=$r
    done
    return "$rc"
}

# The compile-time targets in one run (benchmarks/compile_targets.py): per row, torch.compile
# cold, torchfuse cold and warm, each in a fresh process. TARGETS_ARGS picks the rows
# (default: the micro rows' cold-compile set); ";;" separates several runs.
phase_targets() {
    local t ct rc=0 r run n=0 runs dev=cuda extra=() words envs
    have_cuda || { dev=cpu; extra=(--small); }
    mapfile -t runs < <(printf '%s\n' "${TARGETS_ARGS:---only softmax,cross_entropy,layer_norm_train,gpt2,gpt2_train}" \
        | sed 's/;;/\n/g')
    for run in "${runs[@]}"; do
        t=$(phase_timeout "${TARGETS_TIMEOUT_S:-560}")
        ((t < 30)) && return 124
        log "compile_targets.py $run (timeout ${t}s)"
        # counted here, not in the pipeline below: each part of a pipeline runs in a subshell,
        # where ++n was lost and every run wrote (over) the files of run 1
        n=$((n + 1))
        # a run's leading NAME=VALUE words are its environment (e.g. TORCHFUSE_AUTOTUNE=0),
        # the rest compile_targets.py's arguments
        read -r -a words <<<"$run"
        envs=()
        while ((${#words[@]})) && [[ ${words[0]} =~ ^[A-Z_][A-Z0-9_]*= ]]; do
            envs+=("${words[0]}")
            words=("${words[@]:1}")
        done
        # each child may take up to 180 s (torch.compile's training children took 40-70 s), or
        # what is left of the run: a third of it cut MobileNet-V3 training's at 63 s in a run
        # with 189 s left, where the whole row would have fit
        ct=$((t - 10 < 180 ? t - 10 : 180))
        timeout "$t" env "${envs[@]}" "$PY" benchmarks/compile_targets.py --device "$dev" "${extra[@]}" \
            --out "$DEST" --tag "compile_targets_${TAG}_$n" --timeout "$ct" "${words[@]}" 2>&1 \
            | tee -a "$BENCH_LOG"
        r=${PIPESTATUS[0]}
        ((r != 0)) && rc=$r
    done
    return "$rc"
}

# Each Triton compile of a row's first call, stage by stage, both compilers
# (benchmarks/triton_compile_times.py; TCT_ARGS picks the rows).
phase_tritontimes() {
    local t
    t=$(phase_timeout 300)
    ((t < 30)) && return 124
    # shellcheck disable=SC2086  # a list of words on purpose
    timeout "$t" "$PY" benchmarks/triton_compile_times.py --out "$DEST" --tag "triton_compile_times_$TAG" \
        ${TCT_ARGS:---only softmax,cross_entropy,layer_norm_train} 2>&1 | tee -a "$BENCH_LOG"
    return "${PIPESTATUS[0]}"
}

# Forward workloads static vs dynamic=True (the dynamic-shapes issue's table).
phase_dynamic() {
    local t
    t=$(phase_timeout 240)
    ((t < 30)) && return 124
    local extra=()
    have_cuda || extra=(--device cpu --small)
    log "benchmarks/dynamic.py (timeout ${t}s)"
    timeout "$t" "$PY" benchmarks/dynamic.py --tag "$TAG" --out "$DEST" "${extra[@]}" ${DYNAMIC_ARGS:-} \
        2>&1 | tee -a "$BENCH_LOG"
    return "${PIPESTATUS[0]}"
}

# GPT-2: GPU busy vs wall time per call and top kernels, eager / torch.compile / torchfuse.
phase_gpt2prof() {
    local t
    t=$(phase_timeout 240)
    ((t < 30)) && return 124
    have_cuda || { log "gpt2prof needs CUDA"; return 0; }
    log "benchmarks/gpt2_profile.py (timeout ${t}s)"
    # shellcheck disable=SC2086
    timeout "$t" "$PY" benchmarks/gpt2_profile.py --json "$DEST/gpt2_profile_$TAG.json" ${GPT2PROF_ARGS:-} \
        2>&1 | tee -a "$BENCH_LOG"
    return "${PIPESTATUS[0]}"
}

# mode="max-autotune" on the matmul rows, for both compilers: torchfuse's Triton templates
# chosen against cuBLAS per shape, torch.compile's own max-autotune.
phase_autotune() {
    local t
    t=$(phase_timeout 300)
    ((t < 60)) && return 124
    have_cuda || { log "autotune needs CUDA"; return 0; }
    log "benchmarks/run.py --mode max-autotune --compile-mode max-autotune (timeout ${t}s)"
    timeout "$t" "$PY" benchmarks/run.py --only "${AUTOTUNE_ONLY:-swiglu_mlp,attention_naive,swiglu_mlp_train}" \
        --mode max-autotune --compile-mode max-autotune --no-cache-hit --no-plot \
        --tag "${TAG}_max_autotune" --out "$DEST" 2>&1 | tee -a "$BENCH_LOG"
    return "${PIPESTATUS[0]}"
}

# Real transformers models, eager / torch.compile / torchfuse side by side, inference and training
# (benchmarks/models.py). The whole table takes longer than one call: split it with MODELS_ARGS
# ("--mode inference", "--mode training --only gpt2,llama"). Several runs in one phase: separate
# their argument lists with ';;' (e.g. "--only resnet50 ;; --only resnet50 --options {...}");
# run i writes models_${TAG}_r<i>.*, and they share the phase's time cap in order.
phase_models() {
    local t extra=() rc=0 r end i=0 args tag
    end=$((SECONDS + $(phase_timeout "${MODELS_TIMEOUT_S:-420}")))
    if ! have_cuda; then
        log "no CUDA device: models smoke run with tiny configs on the CPU"
        extra=(--small --device cpu --only gpt2,bert --backend aot_eager --rep-ms 20)
    fi
    local runs=()
    mapfile -t runs < <(printf '%s\n' "${MODELS_ARGS:-}" | sed 's/;;/\n/g')
    for args in "${runs[@]}"; do
        i=$((i + 1))
        tag=$TAG
        ((${#runs[@]} > 1)) && tag=${TAG}_r$i
        t=$(phase_timeout 100000 "$end")
        ((t < 60)) && return 124
        # Start no row in the last 75 s, so the one running and the report still fit.
        log "benchmarks/models.py --tag $tag $args (timeout ${t}s, rows started within $((t - 75))s)"
        # shellcheck disable=SC2086  # args is a list of words on purpose
        timeout "$t" "$PY" benchmarks/models.py --tag "$tag" --out "$DEST" --budget-s $((t - 75)) \
            --variant-timeout-s 120 "${extra[@]}" $args 2>&1 | tee -a "$BENCH_LOG"
        r=${PIPESTATUS[0]}
        ((r != 0)) && rc=$r
    done
    return "$rc"
}

# DDP on every GPU of the machine (torchrun, NCCL): the two-rank tests under NCCL, then eager /
# torch.compile / torchfuse DDP training steps with their NCCL overlap (benchmarks/distributed.py;
# the torchfuse profile as a Chrome trace), one model after the other (DIST_MODELS).
phase_dist() {
    local t n end model rc=0
    end=$((SECONDS + $(phase_timeout 540)))
    have_cuda || { log "dist needs CUDA"; return 0; }
    n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    t=$(phase_timeout 150 "$end")
    log "pytest -m gpu tests/distributed ($n GPUs, timeout ${t}s)"
    timeout "$t" "$PY" -m pytest -q -m gpu tests/distributed -p no:cacheprovider 2>&1 | tee -a "$TESTS_LOG"
    rc=${PIPESTATUS[0]}
    ((n < 2)) && { log "dist: one GPU, no benchmark (it needs two)"; return "$rc"; }
    for model in ${DIST_MODELS:-gpt2}; do
        t=$(phase_timeout 400 "$end")
        ((t < 60)) && return 124
        log "torchrun --nproc-per-node $n benchmarks/distributed.py --model $model (timeout ${t}s)"
        # shellcheck disable=SC2086  # DIST_ARGS is a list of words on purpose
        timeout "$t" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
            benchmarks/distributed.py --model "$model" --tag "$TAG" --out "$DEST" ${DIST_ARGS:-} \
            2>&1 | tee -a "$BENCH_LOG"
        ((PIPESTATUS[0] != 0)) && rc=${PIPESTATUS[0]}
    done
    return "$rc"
}

# With $OUT set, everything was written there; keep a copy in benchmarks/results as well.
collect() {
    [[ -z "$OUT_DIR" ]] && return 0
    local f n=0
    for f in "$OUT_DIR"/*"$TAG"*; do
        [[ -f "$f" && "$f" != *.tmp ]] && cp "$f" "$RESULTS/" && n=$((n + 1))
    done
    log "$n files in $OUT_DIR, copied to $RESULTS"
}

main() {
    local phases=("$@") p rc failed=0
    ((${#phases[@]})) || phases=(tests capture bench overhead)
    for p in "${phases[@]}"; do
        case $p in setup | tests | capture | bench | overhead | modes | warm | compileprof | targets | tritontimes | dynamic | gpt2prof | autotune | models | dist) ;;
            *) echo "unknown phase '$p' (setup tests capture bench overhead modes warm compileprof targets tritontimes dynamic gpt2prof autotune models dist)" >&2
               exit 2 ;; esac
    done
    log "phases: setup ${phases[*]/setup/}; budget ${BUDGET}s; files in $DEST/*$TAG*"
    phase_setup
    rc=$?
    record setup "$rc"
    ((rc != 0)) && failed=1
    for p in "${phases[@]}"; do
        [[ $p == setup ]] && continue
        "phase_$p"
        rc=$?
        record "$p" "$rc"
        ((rc != 0)) && failed=1
    done
    log "done in $((SECONDS - START))s: ${SUMMARY[*]/%/;}"
    collect
    return "$failed"
}

main "$@"
