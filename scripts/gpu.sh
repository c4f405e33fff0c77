#!/usr/bin/env bash
# laga on a GPU machine: every check and measurement, one subcommand each (`bash scripts/gpu.sh help`).
#
#   (here)  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build laga laga_gpu_tests
#           bash scripts/gpu.sh pack build            # -> build/dist-run, the folder to carry
#   (there) bash scripts/gpu.sh <subcommand> build/dist-run [arguments]
#
# What every subcommand on the GPU machine shares, written once below:
#   - the carried build: the first argument (default build/dist-run), made by `pack`: laga, laga_gpu_tests, the
#     libraries a bare machine may lack (OpenBLAS and its Fortran runtime, Open MPI; in libs.tar.gz, unpacked on
#     first use) and BUILD, the commit the binaries were built from and whether the tree was clean;
#   - the environment (`env` prints it): the carried libraries first, then the machine's cuBLASLt, NCCL, cuDNN and
#     CUDA runtime; NVLink multicast off (it can take the host's GPUs out of service); mpirun
#     as root;
#   - the output folder: $OUT, else /tmp/laga_gpu_<subcommand>; every subcommand first prints the build's commit
#     and tree state and writes it to build.txt there, so each result names the code it measured.
# A machine without a GPU gets a message saying so (exit 1); an unknown subcommand exit 2.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SELF=$(pwd)/scripts/gpu.sh
DEFAULT_DIST=build/dist-run
MACHINE_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}  # before gpu_env: what PyTorch's own process runs with

usage() {
  cat <<'EOF'
usage: bash scripts/gpu.sh <subcommand> [arguments]    (dist: the carried build, default build/dist-run)
  help                                     this list
  pack [build] [py]                        (here) laga, laga_gpu_tests, BUILD and libs.tar.gz into <build>/dist-run, the folder to carry; py: the Python package too
  env [dist]                               the environment the GPU subcommands run in, as export lines: eval "$(bash scripts/gpu.sh env DIST)"
  check-summary FILE                       the worst relative error per suite, output and dtype of the GPU tests' GPUCHECK lines
  check [dist] [filter]                    the GPU test suite with the disabled timing tests: failures, worst error per op and dtype, timings
  sanitize [dist] [tools]                  compute-sanitizer (memcheck racecheck synccheck) over every kernel at small shapes; bitwise reruns of laga run
  run-check [dist] [steps]                 laga run end to end (steps 1234, 5 on demand): communicator tests, P = 1 checks, phantom vs plan, mpirun checks
  smoke [dist]                             the block and attention tests, then phantom rank 7 of 8 at DeepSeek-V3 (a2a, every variant and kernel)
  short [dist] [seconds] [parts]           what fits a few minutes (parts tmnpgdab, default tmnpgda): correctness side by side, then measurements
  all [dist] [parts]                       every check and measurement of one GPU (parts 1-6, default 123456), each with its own time limit
  multi [dist] [Ps] [parts] [seqs]         one rank per GPU over NCCL: --check per form x layout (part 1), DeepSeek-V3 timing vs the model (part 2)
  overlap [dist] [seq]                     exposed communication with the timed phantom, with and without --overlap, and the ring beside all_gather
  cudnn [dist] [parts] [seqs] [rounds]     the cuDNN provider and the PyTorch peer (parts tbapc, and s): tests, block check, attention table, bench, peer (in rounds), attention under sustained load
  block-profile [dist] [parts] [seqs]      where a rank's block spends its time, op by op (parts tbao), clocks and power sampled
  bench-attention [dist] [filter]          attention correctness, the perf test's timings, PyTorch SDPA at 192/128 beside them
  profile [dist] [fwd|bwd] [sections...]   Nsight Compute on the warp-specialised 192/128 attention forward or backward (h 16, S 8k)
  traffic [dist] [seqs]                    HBM and L2 bytes of laga's and cuDNN's forward at the all_gather and a2a ranks (ncu); both kernels' head groups timed
  traffic-bwd [dist] [shapes] [groups]     HBM and L2 bytes of the 192/128 backward per head group (ncu), then each group timed under sustained load
  torch [dist] [gpu_torch.py options]      laga's PyTorch module against laga run and plain PyTorch (scripts/gpu_torch.py)
EOF
}

# ---------------------------------------------------------------- shared

die() { echo "gpu.sh $SUB: $1" >&2; exit "${2:-1}"; }

need_gpu() {  # a clear message, not a crash, where there is no GPU
  local why=""
  if ! command -v nvidia-smi >/dev/null; then
    why="nvidia-smi not found"
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    why="nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
  [ -z "$why" ] || die "no NVIDIA GPU on this machine ($why). It runs on a GPU machine: build here, \`bash scripts/gpu.sh pack build\`, carry build/dist-run and run \`bash scripts/gpu.sh $SUB build/dist-run\` there."
}

use_dist() {  # the carried build folder (absolute), its libraries unpacked
  local d=${1:-$DEFAULT_DIST}
  dist=$(cd "$d" 2>/dev/null && pwd) || die "no carried build at '$d' (make one with \`bash scripts/gpu.sh pack BUILD\` and carry BUILD/dist-run)" 2
  if [ -f "$dist/libs.tar.gz" ] && [ ! -d "$dist/libs" ]; then
    tar -xzf "$dist/libs.tar.gz" -C "$dist" || die "cannot unpack $dist/libs.tar.gz"
  fi
}

need_bin() { [ -x "$dist/$1" ] || die "$dist/$1 is missing (pack a build that has it: ninja -C BUILD laga laga_gpu_tests)" 2; }

missing_libs() {  # prints and fails when a binary lacks a shared library here
  if ldd "$1" | grep -q 'not found'; then
    echo "missing libraries:"; ldd "$1" | grep 'not found'; return 1
  fi
}

lib_dirs() {  # the folders holding a library of the machine's (toolkit lib64 or a pip wheel's), ':'-joined
  find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib /opt /usr/local/lib -name "$1" \
    -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':'
}

gpu_env() {
  [ "${LAGA_GPU_ENV:-}" = "$dist" ] && return  # set already (a subcommand running another)
  # cuDNN: opened at run time by the cuDNN attention provider; the CUDA runtime its frontend opens beside laga's.
  LD_LIBRARY_PATH="$dist/libs:$(lib_dirs 'libcublasLt.so.13*')$(lib_dirs 'libnccl.so.2*')$(lib_dirs 'libcudnn.so.9')$(lib_dirs 'libcudart.so.13')${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export LAGA_GPU_ENV=$dist
}

torch_python() {  # the machine's PyTorch
  python=/opt/torch/.venv/bin/python
  [ -x "$python" ] || python=python3
}

torch_cudnn_first() {  # laga opens the cuDNN PyTorch ships with (the one its SDPA runs) ahead of any other copy
  local d
  d=$("$python" -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"
}

build_stamp() {  # the commit the carried binaries were built from and the tree's state then (pack writes BUILD)
  local commit=unknown dirty=-1
  if [ -f "$dist/BUILD" ]; then
    commit=$(sed -n 's/^commit=//p' "$dist/BUILD")
    dirty=$(sed -n 's/^dirty=//p' "$dist/BUILD")
  fi
  export LAGA_BUILD_COMMIT=$commit LAGA_BUILD_DIRTY=$dirty  # for the Python measurements' documents
  case $dirty in
    0) echo "build: commit $commit, clean tree" ;;
    1) echo "build: commit $commit WITH UNCOMMITTED CHANGES (figures from it are not reproducible from the commit)" ;;
    *) echo "build: commit $commit, tree state unknown${1:+ ($1)}" ;;
  esac
}

out_dir() {  # $final: $OUT or /tmp/laga_gpu_<name>, with the build stamp in build.txt
  final=${OUT:-/tmp/laga_gpu_$1}
  mkdir -p "$final"
  # Not in a pipeline: build_stamp's exports must reach the commands that follow.
  build_stamp "$([ -f "$dist/BUILD" ] || echo "no BUILD in $dist: not made by gpu.sh pack")" >"$final/build.txt"
  cat "$final/build.txt"
}

work_dir() { work=$(mktemp -d "/tmp/laga_gpu_$1.XXXXXX"); }

EXIT_CMDS=()
at_exit() { EXIT_CMDS+=("$1"); trap 'local_exit_cmds' EXIT; }
local_exit_cmds() { local c; for c in "${EXIT_CMDS[@]}"; do eval "$c"; done; }

gpu_start() {  # every GPU subcommand: GPU, carried build, environment, output folder
  need_gpu
  use_dist "${1:-}"
  gpu_env
  out_dir "$2"
}

# ---------------------------------------------------------------- here

cmd_pack() {  # the folder to carry: laga, laga_gpu_tests, BUILD, and libs.tar.gz (OpenBLAS, Fortran runtime, Open MPI)
  # With `py` after the build folder, also py/: the Python package built here with CUDA (and cuDNN's provider,
  # from the main build's cudnn-frontend headers) against build/venv's PyTorch, which `torch` imports there.
  local build=${1:-build} with_py=${2:-}
  [ -z "$with_py" ] || [ "$with_py" = py ] || die "pack: '$with_py' after the build folder: only 'py' is known" 2
  [ -d "$build" ] || die "no build folder '$build'" 2
  dist=$build/dist-run
  rm -rf "$dist" && mkdir -p "$dist/libs" "$dist/mpi/bin" "$dist/mpi/lib" "$dist/mpi/share"
  local bin copied=0
  for bin in "$build/laga" "$build/tests/gpu/laga_gpu_tests"; do
    [ -x "$bin" ] || { echo "pack: $bin not built (skipped)"; continue; }
    cp "$bin" "$dist/"; copied=1
    ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'openblas|gfortran|quadmath|gomp' |
      while read -r lib; do cp -L "$lib" "$dist/libs/"; done
  done
  [ "$copied" -eq 1 ] || die "neither laga nor laga_gpu_tests is built in '$build'" 2
  # The commit and tree state the binaries were built from (cmake/build_commit.cmake's header).
  local header=$build/generated/laga_build_commit.hpp
  {
    echo "commit=$(sed -n 's/^#define LAGA_BUILD_COMMIT "\(.*\)"/\1/p' "$header" 2>/dev/null || echo unknown)"
    echo "dirty=$(sed -n 's/^#define LAGA_BUILD_DIRTY //p' "$header" 2>/dev/null || echo -1)"
    echo "packed=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  } >"$dist/BUILD"
  # Open MPI as installed here (Debian's layout under a prefix, so OPAL_PREFIX relocates it); used there only if
  # the machine has no Open MPI laga can start with.
  if [ -x "$build/laga" ] && ldd "$build/laga" | grep -q 'libmpi.so'; then
    local mpi_libdir ompi_pkglib ompi_data lib
    mpi_libdir=$(dirname "$(ldd "$build/laga" | awk '/libmpi.so/ {print $3}')")
    for lib in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 \
               libevent_pthreads-2.1.so.7 libpmix.so.2 libmca_common_sm.so.40 libmca_common_monitoring.so.50 \
               libmca_common_ompio.so.41 libnuma.so.1 libudev.so.1 libz.so.1; do
      [ -e "$mpi_libdir/$lib" ] && cp -L "$mpi_libdir/$lib" "$dist/mpi/lib/"
    done
    ompi_pkglib=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed 's/.*://')
    ompi_data=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed 's/.*://')
    mkdir -p "$dist/mpi/lib/x86_64-linux-gnu/openmpi/lib"
    cp -rL "$ompi_pkglib" "$dist/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"
    cp -rL "$ompi_data" "$dist/mpi/share/openmpi"
    cp -L "$(command -v orterun)" "$(command -v orted)" "$dist/mpi/bin/"
  fi
  ls "$dist/libs"
  # Compressed to a third of the size (less to copy to the GPU machine), unpacked there on first use.
  tar -czf "$dist/libs.tar.gz" -C "$dist" libs mpi && rm -rf "$dist/libs" "$dist/mpi"
  if [ "$with_py" = py ]; then
    bash scripts/python_env.sh || die "pack: the Python environment (scripts/python_env.sh) failed"
    bash scripts/fetch_cudnn_frontend.sh "$build"
    build/venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
      --target "$dist/py" -C build-dir=build/python-cuda -C cmake.define.LAGA_WITH_CUDA=ON \
      -C cmake.define.LAGA_CUDNN_FRONTEND_DIR="$(pwd)/$build/_deps/cudnn-frontend/include" . ||
      die "pack: building the Python package with CUDA failed"
    rm -rf "$dist/py/bin"
  fi
  du -sh "$dist"; ls "$dist"; cat "$dist/BUILD"
  if grep -qx 'dirty=1' "$dist/BUILD"; then
    echo "pack: WARNING: built from a tree with uncommitted changes; every document measured with it records so" \
         "(build.dirty) and docs/results.md flags it. Commit, rebuild and pack again for results to keep."
  fi
}

cmd_env() {  # export lines, for a command of one's own on the GPU machine
  use_dist "${1:-}"
  gpu_env
  local v
  for v in LD_LIBRARY_PATH NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS \
           OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM; do
    printf 'export %s=%q\n' "$v" "${!v}"
  done
}

cmd_check_summary() {
  # The worst relative error per suite, output and dtype from the GPUCHECK lines of the GPU tests. Fields are
  # found by their key, not their position, since the lines differ in how many words they carry:
  #   GPUCHECK <Suite>/<Case>.<Test>/<param> <tensor> <dtype> rel_err=<e> tol=<t>     (gpu_test_util.hpp report)
  #   GPUCHECK Block/<platform>.<case>_<kernel>_<variant> <tensor> <dtype> rel_err=<e> tol=<t>  (tests/conformance)
  #   GPUCHECK LagaVsExplicitSameP/<layout> <kernel> [kv-grad-fp32] P=<n> worst_rel_error=<e>  (test_nccl.cpp)
  # Lines with neither key (scratch, bitwise flags) are not errors and are skipped.
  [ $# -ge 1 ] || die "usage: bash scripts/gpu.sh check-summary FILE (GPUCHECK lines of laga_gpu_tests)" 2
  awk '
  {
    err = ""; tol = "-"
    for (i = 3; i <= NF; i++) {
      if ($i ~ /^(rel_err|worst_rel_error)=/) { split($i, e, "="); err = e[2] }
      else if ($i ~ /^tol=/) { split($i, t, "="); tol = t[2] }
    }
    if (err == "") next
    if ($0 ~ /worst_rel_error=/) {  # one line per configuration: the words before the error name it
      key = $2
      for (i = 3; i <= NF && $i !~ /^worst_rel_error=/; i++) key = key " " $i
    } else {
      split($2, a, "/"); suite = a[2]; sub(/\..*/, "", suite); key = suite " " $3 " " $4
    }
    v = err + 0
    if (!(key in worst) || v > worst[key] || err ~ /nan/) { worst[key] = v; where[key] = $2; tols[key] = tol }
    n[key]++
  }
  END { for (k in worst) printf "%-34s %9.2e (tol %s, %d checks) worst: %s\n", k, worst[k], tols[k], n[k], where[k] }
  ' "$@"
}

# ---------------------------------------------------------------- there

cmd_check() {  # the GPU suites and a short table of what they measured; full logs in the output folder
  gpu_start "${1:-}" check
  local filter=${2:-*} bin=$dist/laga_gpu_tests
  need_bin laga_gpu_tests
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-8}
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
  missing_libs "$bin" || exit 1
  local start rc
  start=$(date +%s)
  "$bin" --gtest_filter="$filter" --gtest_also_run_disabled_tests >"$final/gpu_tests.log" 2>&1
  rc=$?
  grep '^GPUCHECK' "$final/gpu_tests.log" >"$final/gpu_checks.txt"
  grep -E '^\[  FAILED  \]' "$final/gpu_tests.log" | sort -u | head -40
  grep -B3 -E 'Failure|error:' "$final/gpu_tests.log" | head -60
  echo
  echo "== worst relative error per suite, output and dtype (against CPU float64) =="
  cmd_check_summary "$final/gpu_checks.txt" | sort
  echo
  echo "== timings =="
  grep '^GPUPERF' "$final/gpu_tests.log" | sed 's/^GPUPERF //'
  echo
  grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test|tests? ran' "$final/gpu_tests.log"
  echo "exit code $rc, $(( $(date +%s) - start ))s"
  exit $rc
}

cmd_sanitize() {
  # Every kernel of the CUDA backend under compute-sanitizer at small shapes: the attention paths (eager; the
  # generic FMA kernel; the tensor-core kernels at 192/128 and 576/512; the fused-dQ backward), both dtypes (float32
  # takes the generic kernel, bfloat16 on dense views the tensor-core kernels), and under memcheck the GEMM, copy,
  # RMSNorm and RoPE ops, under racecheck the strided RMSNorm. Each tool's error summary; reports inside cuBLASLt's
  # own kernels (nvjet_*) listed apart. Then bitwise reruns: the same `laga run --device cuda ... --save` twice must
  # write byte-identical files. Exit 1 on any report or difference.
  gpu_start "${1:-}" sanitize
  need_bin laga_gpu_tests
  local tools=${2:-memcheck racecheck synccheck} cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$cs" ] || die "compute-sanitizer not found"
  local attention='Ops/CudaAttention.*/tiny_mha_*:Ops/CudaAttention.*/mha_multi_tile_*:Ops/CudaAttention.*/gqa_offset_*'
  attention+=':Ops/CudaAttention.*/mha_192_128_dense_negative_offset_*:Ops/CudaAttention.*/gqa_192_128_dense_multi_tile_*'
  attention+=':Ops/CudaAttention.*/mqa_576_512_absorbed_dense_h16_*:Ops/CudaAttention.*/mqa_576_512_separate_v_dense_*'
  attention+=':Ops/CudaAttentionFusedDq.*/mha_192_128_dense_negative_offset:Ops/CudaAttentionFusedDq.*/gqa_192_128_dense_multi_tile'
  local status=0 tool filter start rc summary tests ours vendor
  for tool in $tools; do
    case $tool in
      memcheck) filter="$attention:*CudaGemm*f32*:*CudaCopy*bf16*:*CudaRmsNorm*small*:*CudaRope*query*" ;;
      racecheck) filter="$attention:*CudaRmsNorm*small_strided_f32" ;;
      *) filter=$attention ;;
    esac
    start=$(date +%s)
    timeout "${TOOL_TIMEOUT:-200}" "$cs" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$dist/laga_gpu_tests" --gtest_filter="$filter:-*BitwiseDeterministicOnRerun*" >"$final/sanitize_$tool.log" 2>&1
    rc=$?
    summary=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$final/sanitize_$tool.log")
    tests=$(grep -m1 -E '^\[  PASSED  \]' "$final/sanitize_$tool.log")
    ours=$(grep -E '^========= +(Invalid|Race|Barrier|Error)' "$final/sanitize_$tool.log" | grep -vc 'nvjet_')
    vendor=$(grep -E '^========= +(Invalid|Race|Barrier|Error)' "$final/sanitize_$tool.log" | grep -c 'nvjet_')
    echo "compute-sanitizer $tool: exit $rc, ${summary:-no summary} ($tests; $(( $(date +%s) - start )) s;" \
         "$(grep -c '^\[       OK' "$final/sanitize_$tool.log") tests done; reports in laga's kernels: $ours, in cuBLASLt's: $vendor)"
    [ "$rc" -eq 0 ] || { status=1; grep -m10 -E '=========  ?(Invalid|Race|Barrier|Error|Program hit)' "$final/sanitize_$tool.log"; tail -5 "$final/sanitize_$tool.log"; }
  done
  [ -x "$dist/laga" ] || { echo "no laga in $dist: bitwise reruns skipped"; exit 1; }
  # Bitwise reruns on the GPU (bf16, both kernels, both layouts, LAGA, explicit and absorbed, P = 1).
  local args ok run
  for args in "--form laga --layout a2a --kernel fused" "--form explicit --layout all_gather --kernel eager" \
              "--form absorbed --layout a2a --kernel fused"; do
    ok=1
    for run in a b; do
      # shellcheck disable=SC2086
      "$dist/laga" run --device cuda --model small --seq 512 --batch 2 $args --save "$final/rerun_$run" \
        >"$final/rerun_$run.log" 2>&1 || { ok=0; echo "laga run --device cuda $args: exit $?"; tail -3 "$final/rerun_$run.log"; }
    done
    if [ "$ok" -eq 1 ] && diff -r -q "$final/rerun_a" "$final/rerun_b" >/dev/null; then
      echo "bitwise rerun, laga run --device cuda --model small --seq 512 --batch 2 $args: $(ls "$final/rerun_a" | wc -l) files byte-identical"
    else
      status=1
      echo "bitwise rerun, $args: FILES DIFFER (or a run failed)"
    fi
    rm -rf "$final/rerun_a" "$final/rerun_b"
  done
  exit $status
}

cmd_run_check() {
  # `laga run` on the GPU: the CLI end to end, steps by number (default 1234), each with its own time limit:
  #   1. the GPU communicator tests (tests/gpu/test_nccl.cpp: NCCL and host staging at P = 1, host staging over 2
  #      and 4 thread ranks sharing the GPU);
  #   2. `laga run --device cuda --check` at P = 1 for every variant x layout x kernel (bf16), and through NCCL and
  #      host staging at P = 1 (--comm);
  #   3. phantom rank 7 of 8, DeepSeek-V3, S = 16384, bf16: every variant x layout x kernel in one process, its
  #      saved bytes against `laga plan --dtype bfloat16 --json` (must be EQUAL), time by phase, device memory;
  #   4. `mpirun -np 2|4|8 laga run --device cuda --check` (the ranks share the GPU: MPI with host staging), laga,
  #      explicit and absorbed, both layouts, fused and eager, bf16 (and float32 at np 4, fused); the ring (p2p)
  #      for laga and explicit, fused, bf16;
  #   5. step 4's all_gather bf16 runs with --kv-grad-reduce-in-fp32.
  # A summary to stdout and summary.txt (written as the steps go, so a run stopped at its limit still reports);
  # logs and JSON documents in results.tar.gz.
  gpu_start "${1:-}" run
  need_bin laga
  local steps=${2:-1234} LAGA=$dist/laga SUMMARY=$final/summary.txt
  work_dir run
  cat "$final/build.txt" >"$SUMMARY"
  say() { echo "$*" | tee -a "$SUMMARY"; }
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-4}

  say "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
  say "libnccl: $(lib_dirs 'libnccl.so.2*')"
  say "system mpirun: $(command -v mpirun || echo none) $( (mpirun --version 2>&1 || true) | head -1)"

  # Open MPI: the machine's if laga runs with it (libmpi.so.40, an Open MPI mpirun), else the bundled one.
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
  local MPIRUN=""
  probe() { timeout 60 "$LAGA" run --model tiny --seq 16 >"$work/probe.log" 2>&1; }
  if command -v mpirun >/dev/null && mpirun --version 2>&1 | grep -q 'Open MPI' && ! ldd "$LAGA" | grep -q 'libmpi.*not found' && probe; then
    MPIRUN=$(command -v mpirun)
    say "MPI: the machine's ($MPIRUN)"
  else
    export OPAL_PREFIX=$dist/mpi
    export LD_LIBRARY_PATH="$dist/mpi/lib:$LD_LIBRARY_PATH"
    export PATH="$dist/mpi/bin:$PATH"
    export OMPI_MCA_mca_base_component_path=$dist/mpi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
    export OMPI_MCA_mca_base_component_show_load_errors=0
    if probe; then
      MPIRUN=$dist/mpi/bin/orterun
      say "MPI: the bundled Open MPI ($($MPIRUN --version 2>&1 | head -1))"
    else
      say "MPI: laga cannot start here with the machine's or the bundled Open MPI; mpirun steps skipped"
      tail -20 "$work/probe.log" | tee -a "$SUMMARY"
    fi
  fi
  missing_libs "$LAGA" | tee -a "$SUMMARY"
  check_table() { python3 scripts/check_table.py "$@"; }  # JSON documents of `laga run --check`

  if [[ $steps == *1* ]]; then
    say ""
    say "== 1. GPU communicator tests (tests/gpu/test_nccl.cpp; the block through host staging, test_cuda_block.cpp)"
    NCCL_DEBUG=VERSION timeout 150 "$dist/laga_gpu_tests" --gtest_filter='*GpuComm*:*HostStaging*:*CudaMemInfo*' \
      >"$work/gtest_nccl.log" 2>&1
    local rc=$?
    say "exit $rc; $(grep -m1 -o 'NCCL version [^ ]*' "$work/gtest_nccl.log")"
    grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\]' "$work/gtest_nccl.log" | tee -a "$SUMMARY"
    grep -B2 -A6 'Failure' "$work/gtest_nccl.log" | head -40 | tee -a "$SUMMARY"
    # GPUCHECK Block/cuda_host_staging.<config>_P<n>_S<s>_B<b>_<layout>_<dtype>_<kernel>_<variant> <tensor> <dtype> rel_err=<e> tol=<t>
    awk '/^GPUCHECK Block\/cuda_host_staging\./ { k = $2; sub(/^[^.]*\./, "", k); split($5, e, "=");
           if (!(k in w) || e[2] + 0 > w[k]) { w[k] = e[2] + 0; t[k] = $6 } }
         END { for (c in w) printf "  %-64s worst rel. error %.2e (%s)\n", c, w[c], t[c] }' "$work/gtest_nccl.log" |
      sort | tee -a "$SUMMARY"
  fi

  if [[ $steps == *2* ]]; then
    say ""
    say "== 2. laga run --device cuda --check at P = 1 (model small, S = 256, batch 2, bf16)"
    local p1=() layout kernel variant tag form comm
    for layout in a2a all_gather; do
      for kernel in eager fused; do
        for variant in "explicit" "absorbed --absorbed-attention mqa" "absorbed --absorbed-attention expanded" "laga" \
                       "laga --recompute kv"; do
          tag=p1_$(echo "$variant $layout $kernel" | tr -c 'a-z0-9\n' '_')
          # shellcheck disable=SC2086
          timeout 60 "$LAGA" run --device cuda --model small --seq 256 --batch 2 --form $variant --layout "$layout" \
            --kernel "$kernel" --check --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || say "  exit $? for $variant $layout $kernel"
          p1+=("$work/$tag.json")
        done
      done
    done
    for form in explicit laga; do  # the ring (p2p): fused only
      tag=p1_${form}_p2p_fused
      timeout 60 "$LAGA" run --device cuda --model small --seq 256 --batch 2 --form "$form" --layout p2p --kernel fused \
        --check --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || say "  exit $? for $form p2p fused"
      p1+=("$work/$tag.json")
    done
    for comm in nccl host-staging; do
      NCCL_DEBUG=WARN timeout 60 "$LAGA" run --device cuda --comm "$comm" --model small --seq 256 --batch 2 --form laga \
        --check --json "$work/p1_comm_$comm.json" >"$work/p1_comm_$comm.log" 2>&1 || say "  exit $? for --comm $comm"
      p1+=("$work/p1_comm_$comm.json")
    done
    check_table "${p1[@]}" | tee -a "$SUMMARY"
  fi

  if [[ $steps == *3* ]]; then
    say ""
    say "== 3. phantom rank 7 of 8: DeepSeek-V3, S = 16384, bf16, every variant x layout x kernel"
    local start plans=()
    start=$(date +%s)
    timeout 300 "$LAGA" run --device cuda --model deepseek-v3 --seq 16384 --sp 8 --phantom-rank 7 --form all --layout all \
      --warmup 1 --kernel all --json "$work/phantom_dsv3.json" >"$work/phantom_dsv3.log" 2>&1
    local rc=$?
    say "exit $rc in $(( $(date +%s) - start )) s; $(grep -m1 'phantom rank' "$work/phantom_dsv3.log")"
    for layout in a2a all_gather; do
      for kernel in eager fused; do
        "$LAGA" plan --model deepseek-v3 --seq 16384 --sp 8 --dtype bfloat16 --layout "$layout" --kernel "$kernel" --json \
          >"$work/plan_dsv3_${layout}_${kernel}.json"
        plans+=("$work/plan_dsv3_${layout}_${kernel}.json")
      done
    done
    cp "$work/phantom_dsv3.json" "$work/phantom_dsv3.log" "$final/" 2>/dev/null
    if [ -s "$work/phantom_dsv3.json" ]; then
      python3 scripts/phantom_vs_plan.py "$work/phantom_dsv3.json" "${plans[@]}" | tee -a "$SUMMARY"
    else
      tail -30 "$work/phantom_dsv3.log" | tee -a "$SUMMARY"
    fi
  fi

  say ""
  local np dtype mp=() kv=()
  if [[ $steps != *4* ]]; then
    :
  elif [ -n "$MPIRUN" ]; then
    say "== 4. mpirun -np 2|4|8 laga run --device cuda --check (ranks share the GPU: MPI with host staging)"
    for np in 2 4 8; do
      for dtype in bfloat16 float32; do
        for kernel in fused eager; do
          for form in laga explicit absorbed; do
            for layout in a2a all_gather p2p; do
              # p2p (the ring): explicit and laga, fused, bf16.
              [ "$layout" = p2p ] && { [ "$kernel" = eager ] || [ "$form" = absorbed ] || [ "$dtype" = float32 ]; } && continue
              # float32 (the plumbing at float precision): np 4, fused, laga a2a and explicit all_gather.
              [ "$dtype" = float32 ] && { [ "$np" != 4 ] || [ "$kernel" = eager ] || [ "$form/$layout" = laga/all_gather ] ||
                                          [ "$form/$layout" = explicit/a2a ] || [ "$form" = absorbed ]; } && continue
              tag=mpi_np${np}_${dtype}_${kernel}_${form}_${layout}
              timeout 90 "$MPIRUN" -np "$np" --bind-to none "$LAGA" run --device cuda --dtype "$dtype" --model small \
                --seq 256 --batch 2 --form "$form" --layout "$layout" --kernel "$kernel" --check \
                --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || say "  exit $? for $tag"
              mp+=("$work/$tag.json")
            done
          done
        done
      done
    done
    check_table "${mp[@]}" | tee -a "$SUMMARY"
    grep -h -m1 -E 'error|Error|failure' "$work"/mpi_*.log | sort -u | head -5 | tee -a "$SUMMARY"
  else
    say "== 4. skipped: no usable mpirun"
  fi

  say ""
  if [[ $steps != *5* ]]; then
    :
  elif [ -n "$MPIRUN" ]; then
    say "== 5. mpirun -np 2|4|8 laga run --device cuda --check --kv-grad-reduce-in-fp32 (all_gather, bf16)"
    for np in 2 4 8; do
      for kernel in fused eager; do
        for form in laga explicit absorbed; do
          tag=mpi_np${np}_kvfp32_${kernel}_${form}_all_gather
          timeout 90 "$MPIRUN" -np "$np" --bind-to none "$LAGA" run --device cuda --dtype bfloat16 --model small \
            --seq 256 --batch 2 --form "$form" --layout all_gather --kernel "$kernel" --kv-grad-reduce-in-fp32 --check \
            --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || say "  exit $? for $tag"
          kv+=("$work/$tag.json")
        done
      done
    done
    check_table "${kv[@]}" | tee -a "$SUMMARY"
    grep -h -m1 -E 'error|Error|failure' "$work"/mpi_*kvfp32*.log | sort -u | head -5 | tee -a "$SUMMARY"
  else
    say "== 5. skipped: no usable mpirun"
  fi

  tar -czf "$final/results.tar.gz" -C "$work" .
  echo "logs and JSON: $final/results.tar.gz"
}

cmd_smoke() {  # after a change: the GPU block and attention tests, then phantom rank 7 of 8 with time by phase
  gpu_start "${1:-}" smoke
  need_bin laga; need_bin laga_gpu_tests
  export OPENBLAS_NUM_THREADS=8
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  timeout 240 "$dist/laga_gpu_tests" --gtest_filter='*CudaBlock*:*CudaAttention*:*CudaLaga*' >"$final/gtest.log" 2>&1
  echo "GPU tests exit $?"; grep -E '^\[ +(PASSED|FAILED) +\]' "$final/gtest.log"; grep -A4 Failure "$final/gtest.log" | head -30
  timeout 240 "$dist/laga" run --device cuda --model deepseek-v3 --seq 16384 --sp 8 --phantom-rank 7 \
    --form all --layout a2a --kernel all --json "$final/phantom-dsv3-s16k-p8-a2a.json" 2>&1 | tail -25
}

cmd_short() {
  # The GPU checks that fit a few minutes on one GPU, in order of need:
  #   A. correctness, three jobs side by side (their timings are not reported, so they may share the GPU):
  #      t: the GPU test suite (`check`); m: the communicator tests and mpirun -np 2|4|8 --check on the one GPU,
  #      all_gather again with the K/V gradients reduced in float32 (`run-check`, steps 1 4 5); n: every form x
  #      layout through NCCL at P = 1 with --check (`multi`, part 1, P = 1);
  #   B. measurements, one at a time, each started only if the time left allows it: p: phantom rank 7 of 8 against
  #      the plan (`run-check`, step 3); g: the block's GEMMs in the block vs alone (`all`, part 4); d: DeepSeek-V3
  #      S = 16384 at P = 1 through NCCL (`multi`, part 2, P = 1); a: attention TFLOP/s next to PyTorch SDPA (`all`,
  #      part 3); b: the committed H200 bench documents, re-measured (`all`, part 5; not by default).
  # Every part's files in short.tar.gz, plus the JSON of the multi-GPU table and the bench documents.
  gpu_start "${1:-}" short
  local budget=${2:-390} parts=${3:-tmnpgda} t0 out
  work_dir short
  out=$work
  at_exit "tar -czf \"$final/short.tar.gz\" -C \"$out\" . 2>/dev/null"
  t0=$(date +%s)
  left() { echo $(( budget - ($(date +%s) - t0) )); }
  # Runs "$@" with OUT=$out/<name> if at least <need> seconds are left; its output to $out/<name>.txt.
  part() {
    local name=$1 need=$2; shift 2
    [[ $parts == *${name:0:1}* ]] || return 0
    if (( $(left) < need )); then echo "== $name: skipped ($(left) s left, needs $need)"; return; fi
    mkdir -p "$out/$name"
    OUT=$out/$name timeout "$(( $(left) - 5 ))" "$@" >"$out/$name.txt" 2>&1
    echo "== $name: exit $? at $(( $(date +%s) - t0 )) s"
  }

  echo "== A. correctness (side by side)"
  part tests 60 bash "$SELF" check "$dist" '*:-*DISABLED*' &
  part mpirun 60 bash "$SELF" run-check "$dist" 145 &
  part nccl_p1 60 bash "$SELF" multi "$dist" 1 1 &
  wait
  grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' "$out/tests.txt" 2>/dev/null | sort -u | head -20
  grep -A12 -E '== worst' "$out/tests.txt" 2>/dev/null | head -40
  sed -n '/== 1\./,$p' "$out/mpirun.txt" 2>/dev/null | grep -vE '^\s*$' | head -90
  grep -vE '^\s*$' "$out/nccl_p1.txt" 2>/dev/null | tail -22

  echo; echo "== B. measurements (one at a time)"
  part phantom 90 bash "$SELF" run-check "$dist" 3
  sed -n '/== 3\./,$p' "$out/phantom.txt" 2>/dev/null | head -40
  part gemms 60 bash "$SELF" all "$dist" 4
  grep -vE '^\s*$' "$out/gemms.txt" 2>/dev/null | tail -12
  part dsv3_nccl 45 bash "$SELF" multi "$dist" 1 2 16384
  grep -vE '^\s*$' "$out/dsv3_nccl.txt" 2>/dev/null | tail -30
  cp "$out"/dsv3_nccl/multi-gpu*.json "$final/" 2>/dev/null
  part attention 80 bash "$SELF" all "$dist" 3
  grep -vE '^\s*$' "$out/attention.txt" 2>/dev/null | tail -24
  part bench_documents 60 bash "$SELF" all "$dist" 5
  grep -vE '^\s*$' "$out/bench_documents.txt" 2>/dev/null | tail -8
  cp "$out"/bench_documents/h200-*.json "$final/" 2>/dev/null
  echo "total $(( $(date +%s) - t0 )) s"
}

cmd_all() {
  # Every check and measurement of one GPU machine, each part with its own time limit:
  #   1. the GPU test suite (`check`: every kernel against the CPU in float64, the block per form x layout x kernel,
  #      LAGA bit-identical to explicit at P = 1);
  #   2. the CLI end to end (`run-check`): P = 1 checks, phantom rank 7 of 8 at DeepSeek-V3 (saved bytes EQUAL to
  #      the plan), mpirun -np 2|4|8 on the one GPU with --check (LAGA vs explicit at the same P, 1e-3 in bf16);
  #   3. the attention kernels' TFLOP/s next to PyTorch's scaled_dot_product_attention (cuDNN) at the same shapes,
  #      measured in this call (test_cuda_perf and scripts/bench_sdpa.py);
  #   4. the block's cuBLASLt GEMMs in the block vs alone (phantom rank 7 of 8, DeepSeek-V3 S = 16384, --gemm-check);
  #   5. the committed H200 documents, re-measured: bench/results/h200-deepseek-v3-{fused,eager}.json;
  #   6. explicit vs LAGA attention on a phantom rank with the SM clock and power sampled (nvidia-smi, 50 ms).
  # The summary to stdout; the JSON documents and all logs in one archive (logs.tar.gz).
  gpu_start "${1:-}" all
  need_bin laga
  local parts=${2:-123456} out t
  work_dir all
  out=$work
  at_exit "tar -czf \"$final/logs.tar.gz\" -C \"$out\" . 2>/dev/null; cp \"$out\"/*.json \"$final/\" 2>/dev/null"
  elapsed() { echo "($(( $(date +%s) - $1 )) s)"; }

  if [[ $parts == *1* ]]; then
    t=$(date +%s)
    echo "== 1. GPU test suite"
    OUT=$out/tests timeout 420 bash "$SELF" check "$dist" '*:-*DISABLED*' >"$out/tests.txt" 2>&1
    grep -E '^\[  FAILED  \]' "$out/tests.txt" | sort -u | head -20
    grep -A12 -E 'Failure' "$out/tests/gpu_tests.log" | head -60
    grep -E '^\[  PASSED  \]|^exit code' "$out/tests.txt"
    echo "part 1 $(elapsed "$t")"
  fi
  if [[ $parts == *2* ]]; then
    t=$(date +%s)
    echo; echo "== 2. the CLI on the GPU"
    OUT=$out/run timeout 540 bash "$SELF" run-check "$dist"
    echo "part 2 $(elapsed "$t")"
  fi
  if [[ $parts == *3* ]]; then
    t=$(date +%s)
    echo; echo "== 3. attention TFLOP/s (ours, then PyTorch SDPA at the 192/128 shapes)"
    timeout 300 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests \
      --gtest_filter='CudaPerf.DISABLED_Attention*LongSequences' >"$out/perf.log" 2>&1
    grep -E '^GPUPERF' "$out/perf.log" | sed 's/^GPUPERF //'
    grep -E 'FAILED|rror' "$out/perf.log" | head -5
    # PyTorch with its own libraries: the system's cuDNN (found through our LD_LIBRARY_PATH) is older.
    env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout 200 python3 scripts/bench_sdpa.py >"$out/sdpa.log" 2>&1
    grep -vE '^\s*$' "$out/sdpa.log" | tail -8
    echo "part 3 $(elapsed "$t")"
  fi
  if [[ $parts == *4* ]]; then
    t=$(date +%s)
    echo; echo "== 4. cuBLASLt GEMMs in the block vs alone (phantom rank 7 of 8, DeepSeek-V3, S = 16384, bf16)"
    timeout 300 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --seq 16384 --sp 8 \
      --form explicit,laga,absorbed --kernel fused --layout a2a,all_gather --repeat 3 --gemm-check \
      --out "$out/gemm_check_dsv3_s16k_p8.json" >"$out/gemm_check.log" 2>&1
    echo "exit $?"
    grep -E 'gemms:|a2a|all_gather' "$out/gemm_check.log" | tail -14
    echo "part 4 $(elapsed "$t")"
  fi
  if [[ $parts == *5* ]]; then
    t=$(date +%s)
    echo; echo "== 5. bench documents (phantom rank P-1, DeepSeek-V3, bf16)"
    timeout 240 "$dist/laga" bench --model deepseek-v3 --device cuda --dtype bfloat16 --seq 4096,8192,16384,32768 \
      --sp 8 --batch 1 --form all --layout all --kernel fused --repeat 5 --warmup 1 --seed 1 --phantom \
      --out "$out/h200-deepseek-v3-fused.json" >"$out/bench_fused.log" 2>&1
    echo "fused: exit $?"
    timeout 240 "$dist/laga" bench --model deepseek-v3 --device cuda --dtype bfloat16 --seq 4096,8192,16384 \
      --sp 4,8,16 --batch 1 --form all --layout all --kernel eager --repeat 3 --warmup 1 --seed 1 --phantom \
      --out "$out/h200-deepseek-v3-eager.json" >"$out/bench_eager.log" 2>&1
    echo "eager: exit $?"
    echo "part 5 $(elapsed "$t")"
  fi
  if [[ $parts == *6* ]]; then
    t=$(date +%s)
    echo; echo "== 6. phantom explicit vs LAGA (a2a, fused, S = 16384): attention time, SM clock, power"
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 50 >"$out/clock.csv" 2>&1 &
    local smi=$! form
    for form in explicit laga explicit laga; do
      echo "$form start $(date +%s.%N)" >>"$out/clock_marks.txt"
      timeout 120 "$dist/laga" bench --model deepseek-v3 --device cuda --seq 16384 --sp 8 --phantom --form "$form" \
        --layout a2a --kernel fused --repeat 10 --warmup 2 --out "$out/clock_$form.json" >/dev/null 2>&1
      echo "$form end $(date +%s.%N)" >>"$out/clock_marks.txt"
    done
    kill "$smi" 2>/dev/null
    python3 - "$out" <<'PY'
import csv, datetime, json, sys
out = sys.argv[1]
marks = [l.split() for l in open(f"{out}/clock_marks.txt")]
rows = []
for r in csv.reader(open(f"{out}/clock.csv")):
    try:
        ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((ts, float(r[1].split()[0]), float(r[2].split()[0])))
    except Exception:
        pass
for i in range(0, len(marks), 2):
    form, t0, t1 = marks[i][0], float(marks[i][2]), float(marks[i + 1][2])
    inside = [r for r in rows if t0 <= r[0] <= t1]
    d = json.load(open(f"{out}/clock_{form}.json"))
    att = d["points"][0]["repeats"]["forward"]["by_phase"]["attention"]["median"] * 1e3
    attb = d["points"][0]["repeats"]["backward"]["by_phase"]["attention"]["median"] * 1e3
    if inside:
        print(f"{form:9s} attention fwd {att:6.2f} ms bwd {attb:6.2f} ms | SM clock median {sorted(r[1] for r in inside)[len(inside)//2]:.0f} MHz,"
              f" min {min(r[1] for r in inside):.0f}; power max {max(r[2] for r in inside):.0f} W ({len(inside)} samples)")
    else:
        print(f"{form:9s} attention fwd {att:6.2f} ms bwd {attb:6.2f} ms | no clock samples")
PY
    echo "part 6 $(elapsed "$t")"
  fi
}

cmd_multi() {
  # One host with several GPUs: real NCCL, one rank per GPU (mpirun -np P, --comm nccl). Arguments after dist: the
  # P to run (default the number of GPUs), the parts (default 12), the sequence lengths of part 2.
  #   1. correctness: every form x layout (fused; eager for explicit and LAGA; p2p: explicit and LAGA) at each P,
  #      model small, S = 256, batch 2, bf16, `--check` against the single-rank explicit result, LAGA and absorbed
  #      also against explicit at the same P (1e-3 for LAGA), and against the CPU's float64 result;
  #   2. DeepSeek-V3 size, fused, explicit and LAGA in the three layouts, S = 4k..32k at each P: the block's time
  #      per phase after one warm-up pass, every collective's time and bus bandwidth, LAGA / explicit speed-up, and
  #      the alpha-beta model's prediction for the same points (scripts/multi_gpu_table.py).
  # Summary to stdout; JSON documents and logs in logs.tar.gz, and multi-gpu*.json.
  gpu_start "${1:-}" multi
  need_bin laga
  local gpus ps parts seqs out t
  gpus=$(nvidia-smi -L | grep -c GPU)
  ps=${2:-$gpus}
  parts=${3:-12}
  seqs=${4:-4096 8192 16384 32768}
  work_dir multi
  out=$work
  at_exit "tar -czf \"$final/logs.tar.gz\" -C \"$out\" . 2>/dev/null; cp \"$out\"/multi-gpu*.json \"$final/\" 2>/dev/null"
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export NCCL_DEBUG=WARN OPENBLAS_NUM_THREADS=4
  local LAGA=$dist/laga
  mpi() { timeout "$1" mpirun -np "$2" --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_DEBUG \
            -x OPENBLAS_NUM_THREADS "$LAGA" run --device cuda --comm nccl "${@:3}"; }
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -6

  local docs P layout variant tag form seq
  if [[ $parts == *1* ]]; then
    t=$(date +%s)
    echo; echo "== 1. correctness with NCCL, one rank per GPU (model small, S = 256, batch 2, bf16)"
    docs=()
    for P in $ps; do
      for layout in a2a all_gather; do
        for variant in "explicit" "laga" "laga --recompute kv" "absorbed --absorbed-attention mqa" \
                       "absorbed --absorbed-attention expanded" "explicit --kernel eager" "laga --kernel eager"; do
          tag=check_p${P}_$(echo "$variant $layout" | tr -c 'a-z0-9\n' '_')
          # shellcheck disable=SC2086
          mpi 90 "$P" --model small --seq 256 --batch 2 --form $variant --layout "$layout" --check \
            --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for P=$P $variant $layout"
          docs+=("$out/$tag.json")
        done
      done
    done
    for P in $ps; do  # the ring (p2p): explicit and laga, fused
      for form in explicit laga; do
        tag=check_p${P}_${form}_p2p
        mpi 90 "$P" --model small --seq 256 --batch 2 --form "$form" --layout p2p --check \
          --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for P=$P $form p2p"
        docs+=("$out/$tag.json")
      done
    done
    python3 scripts/check_table.py "${docs[@]}"
    grep -h -m1 -iE 'error|warn' "$out"/check_*.log | sort -u | head -5
    echo "part 1 ($(( $(date +%s) - t )) s)"
  fi

  if [[ $parts == *2* ]]; then
    t=$(date +%s)
    echo; echo "== 2. DeepSeek-V3, bf16, fused: block time, collectives, LAGA vs explicit (one warm-up pass)"
    docs=()
    for P in $ps; do
      for seq in $seqs; do
        for layout in a2a all_gather p2p; do
          for form in explicit laga; do
            tag=dsv3_p${P}_s${seq}_${layout}_${form}
            mpi 120 "$P" --model deepseek-v3 --seq "$seq" --form "$form" --layout "$layout" --kernel fused \
              --warmup 1 --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for $tag"
            docs+=("$out/$tag.json")
          done
        done
      done
    done
    python3 scripts/multi_gpu_table.py "${docs[@]}" --laga "$LAGA" --json "$out/multi-gpu-dsv3.json"
    echo "part 2 ($(( $(date +%s) - t )) s)"
  fi
}

cmd_overlap() {
  # Exposed communication on one GPU: DeepSeek-V3, S = 16384, P = 8, phantom rank 7, a2a, explicit and LAGA, fused,
  # bf16; every point measured with instant collectives and with timed ones (NVLink within a node, InfiniBand
  # across: the alpha-beta model of docs/bench.md), with and without --overlap; then the ring (p2p) beside
  # all_gather with the same timed collectives; then the GPU tests of the timed phantom and of the overlapped block.
  # Writes exposed.json, exposed-overlap.json and exposed-ring.json (laga-bench/2 documents) and prints their tables.
  gpu_start "${1:-}" overlap
  need_bin laga
  local seq=${2:-16384} rc=0 mode flag name
  if ldd "$dist/laga" | grep -q 'libmpi.*not found'; then export LD_LIBRARY_PATH="$dist/mpi/lib:$LD_LIBRARY_PATH"; fi
  for mode in blocking overlap; do
    flag=$([ $mode = overlap ] && echo --overlap)
    name=$([ $mode = overlap ] && echo exposed-overlap || echo exposed)
    # shellcheck disable=SC2086
    timeout 150 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --phantom-comm timed \
      --phantom-link node,cross-node --seq "$seq" --sp 8 --layout a2a --kernel fused --form explicit,laga \
      --repeat 3 --warmup 1 $flag --out "$final/$name.json" || rc=1
  done
  # The ring (p2p: its next shift always runs under the chunk in hand) beside all_gather, same timed phantom.
  timeout 200 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --phantom-comm timed \
    --phantom-link node,cross-node --seq "$seq" --sp 8 --layout all_gather,p2p --kernel fused --form explicit,laga \
    --repeat 3 --warmup 1 --out "$final/exposed-ring.json" || rc=1
  timeout 120 "$dist/laga_gpu_tests" --gtest_filter='CudaOverlap*:CudaTimedPhantom*:CudaAttentionMerge*:P1/GpuCommP1*' || rc=1
  exit $rc
}

cmd_cudnn() {
  # The cuDNN attention provider and the PyTorch peer on one GPU (parts by letter, default tbapc):
  #   t. the provider's GPU tests (every attention case under --attention-provider cudnn against the CPU in float64,
  #      bitwise reruns, refusals) and laga's 192/128 kernels beside them;
  #   b. `laga run --check` of the whole block (DeepSeek-V3, S = 512, LAGA and explicit) with --attention-provider cudnn;
  #   a. `laga bench-attention`: both providers at DeepSeek-V3's per-rank shapes (P = 8, a2a and all_gather) ->
  #      attention-providers.json, the table `auto` chooses from;
  #   p. `laga bench --device cuda --phantom`, DeepSeek-V3, a2a, P = 8, fused, LAGA and explicit per provider (laga,
  #      cudnn, auto; each again with --nondeterministic), then absorbed with laga's kernels, the weight
  #      gradients in bf16 as the peer's (--grad-dtype bfloat16), 10 timed passes after 3 ->
  #      block-<provider>[-nondet].json, block-laga-absorbed.json;
  #   c. scripts/peer_torch_block.py: the same rank in plain PyTorch (SDPA), explicit and LAGA, eager and with
  #      torch.compile around the attention, 10 timed passes after 5 (SDPA's backward settles after several) ->
  #      peer.json;
  #   p and c again in `rounds` rounds (4th argument), each round's documents in round-<r>/.
  #   s. `laga bench-attention` at the perf test's MHA shapes (a2a at P = 1 and 8: 128 and 16 heads; S = 32k, 8k),
  #      10 warm-ups, then more for 2 s, and 30 repeats, so that both providers run at the GPU's power limit as in
  #      training (each measurement after its own 2 s of load) ->
  #      attention-sustained.json, with the SM clock, power and throttle reasons sampled (smi-sustained.csv).
  # The machine may have two cuDNNs (the system's, and PyTorch's wheel's): laga is pointed at PyTorch's (the one its
  # SDPA runs), and the JSON documents record the version loaded. Everything in cudnn.tar.gz; a summary to stdout.
  local rounds=${4:-1}
  [[ $rounds =~ ^[1-9]$ ]] || { echo "gpu.sh cudnn: rounds = '$rounds': a whole number from 1 to 9" >&2; return 2; }
  gpu_start "${1:-}" cudnn
  need_bin laga
  local parts=${2:-tbapc} seqs=${3:-4096,16384,32768} out t0 laga=$dist/laga
  work_dir cudnn
  out=$work
  at_exit "tar -czf \"$final/cudnn.tar.gz\" -C \"$out\" ."
  torch_python
  torch_cudnn_first
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  t0=$(date +%s)
  stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }

  if [[ $parts == *t* ]]; then
    stamp tests
    "$dist/laga_gpu_tests" --gtest_filter='*Cudnn*:*AttentionProvider*:Ops/CudaAttention.*mha_192_128*fused_bf16' \
      >"$out/tests.txt" 2>&1
    echo "exit $?"
    grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]|GPUCHECK cudnn version' "$out/tests.txt" | sort -u | head -30
    grep -E 'GPUCHECK' "$out/tests.txt" | grep -E 'Cudnn' | awk '{print $3, $4, $5}' | sort -k3 | tail -8
  fi
  local form run provider flag forms
  if [[ $parts == *b* ]]; then
    stamp block-check
    # The whole block at DeepSeek-V3's head dims with cuDNN's attention, against explicit on the same backend
    # (bit-identical expected) and the CPU in float64.
    for form in laga explicit; do
      "$laga" run --device cuda --model deepseek-v3 --seq 512 --form $form --attention-provider cudnn --check \
        --json "$out/check-cudnn-$form.json" >"$out/check-cudnn-$form.txt" 2>&1
      echo "$form: exit $?"; grep -E "check|rel|attention calls|error" "$out/check-cudnn-$form.txt" | tail -8
    done
  fi
  if [[ $parts == *a* ]]; then
    stamp bench-attention
    "$laga" bench-attention --model deepseek-v3 --seq "$seqs" --sp 8 --out "$out/attention-providers.json" \
      2>&1 | tee "$out/bench-attention.txt" | grep -vE '^done'
  fi
  if [[ $parts == *s* ]]; then
    stamp bench-attention-sustained
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader,nounits \
      -lms 200 >"$out/smi-sustained.csv" 2>&1 &
    local smi=$!
    "$laga" bench-attention --model deepseek-v3 --seq 32768,8192 --sp 1,8 --layout a2a --repeat 30 --warmup 10 \
      --warmup-seconds 2 --out "$out/attention-sustained.json" 2>&1 | tee "$out/bench-attention-sustained.txt" | grep -vE '^done'
    kill "$smi" 2>/dev/null
  fi
  # Parts p and c in `rounds` rounds (4th argument, default 1), each into round-<r>/ when more than one, the
  # order alternating (odd rounds laga first, even rounds the peer first), so that the GPU's drift between the
  # two (clock, power) shows as the spread of the rounds instead of favouring one side.
  local r dir
  block_docs() {  # $1: the folder
    # *-nondet: the same with --nondeterministic (non-deterministic attention backwards: cuDNN's, as SDPA's, and
    # laga's with dQ added in any order).
    for run in laga cudnn auto laga-nondet cudnn-nondet auto-nondet; do
      provider=${run%-nondet}
      flag=""
      [ "$run" != "$provider" ] && flag=--nondeterministic
      stamp "bench $run"
      # shellcheck disable=SC2086
      "$laga" bench --device cuda --phantom --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --kernel fused \
        --form laga,explicit --attention-provider "$provider" $flag --grad-dtype bfloat16 --repeat 10 --warmup 3 \
        --out "$1/block-$run.json" \
        >"$1/bench-$run.txt" 2>&1
      echo "exit $?"; tail -12 "$1/bench-$run.txt"
    done
    # The absorbed form apart, last: its 576/512 attention loads the GPU 3-4x as long as the others' at the same
    # S, and run between them it would leave the next point a hotter GPU (a lower clock) than the other documents.
    stamp "bench laga-absorbed"
    "$laga" bench --device cuda --phantom --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --kernel fused \
      --form absorbed --attention-provider laga --grad-dtype bfloat16 --repeat 10 --warmup 3 \
      --out "$1/block-laga-absorbed.json" >"$1/bench-laga-absorbed.txt" 2>&1
    echo "exit $?"; tail -6 "$1/bench-laga-absorbed.txt"
  }
  peer_doc() {  # $1: the folder
    stamp peer
    # The peer runs with the machine's own library path (PyTorch finds its libraries).
    LD_LIBRARY_PATH=$MACHINE_LD_LIBRARY_PATH "$python" scripts/peer_torch_block.py --seq "$seqs" --sp 8 --form explicit,laga \
      --compile both --out "$1/peer.json" 2>&1 | tee "$1/peer.txt" | grep -E '^peer'
  }
  for ((r = 1; r <= rounds; ++r)); do
    dir=$out
    if ((rounds > 1)); then dir=$out/round-$r; mkdir -p "$dir"; stamp "round $r"; fi
    if ((r % 2 == 1)); then
      [[ $parts == *p* ]] && block_docs "$dir"
      [[ $parts == *c* ]] && peer_doc "$dir"
    else
      [[ $parts == *c* ]] && peer_doc "$dir"
      [[ $parts == *p* ]] && block_docs "$dir"
    fi
  done
  stamp "done"
}

cmd_block_profile() {
  # Where one rank's block spends its time, op by op, on one GPU (parts by letter, default tbao):
  #   t. the GPU tests of the cuDNN provider, its non-deterministic backward among them;
  #   b. `laga run --check` of the whole block (DeepSeek-V3, S = 512, LAGA) with cuDNN's non-deterministic backward;
  #   a. `laga bench-attention` (a2a shapes): laga's kernels, cuDNN's deterministic and non-deterministic backward;
  #   o. `laga bench --phantom --op-profile`, DeepSeek-V3, a2a, P = 8, LAGA and explicit, with cuDNN's deterministic
  #      and non-deterministic backward: every op's median time -> ops-<mode>.json;
  # with `nvidia-smi dmon` (power, clocks) sampled throughout into dmon.txt. Everything in profile.tar.gz.
  gpu_start "${1:-}" profile
  need_bin laga
  local parts=${2:-tbao} seqs=${3:-4096,16384,32768} out t0 laga=$dist/laga dmon
  work_dir profile
  out=$work
  torch_python
  torch_cudnn_first
  nvidia-smi dmon -s pc -d 1 >"$out/dmon.txt" 2>&1 &
  dmon=$!
  at_exit "kill $dmon 2>/dev/null; tar -czf \"$final/profile.tar.gz\" -C \"$out\" ."
  t0=$(date +%s)
  stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }

  if [[ $parts == *t* ]]; then
    stamp tests
    "$dist/laga_gpu_tests" --gtest_filter='*Cudnn*:*AttentionProvider*' >"$out/tests.txt" 2>&1
    echo "exit $?"
    grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]' "$out/tests.txt" | sort -u | head -20
    grep -E 'GPUCHECK .*mha_192_128.*workspace' "$out/tests.txt" | head -6
  fi
  if [[ $parts == *b* ]]; then
    stamp block-check
    "$laga" run --device cuda --model deepseek-v3 --seq 512 --form laga --attention-provider cudnn --nondeterministic \
      --check --json "$out/check-nondet.json" >"$out/check-nondet.txt" 2>&1
    echo "exit $?"; grep -E "check|rel|attention calls|error" "$out/check-nondet.txt" | tail -6
  fi
  if [[ $parts == *a* ]]; then
    stamp bench-attention
    "$laga" bench-attention --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --out "$out/attention.json" \
      2>&1 | tee "$out/bench-attention.txt" | grep -vE '^done'
    # The same with 30 repeats: does a longer stretch of back-to-back calls run slower (power, clocks)?
    "$laga" bench-attention --model deepseek-v3 --seq "${seqs##*,}" --sp 8 --layout a2a --repeat 30 \
      --out "$out/attention-long.json" 2>&1 | tee "$out/bench-attention-long.txt" | grep -vE '^done'
  fi
  local mode flag
  if [[ $parts == *o* ]]; then
    for mode in det nondet; do
      flag=""
      [ $mode = nondet ] && flag=--nondeterministic
      stamp "op profile $mode"
      # shellcheck disable=SC2086
      "$laga" bench --device cuda --phantom --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --kernel fused \
        --form laga,explicit --attention-provider cudnn $flag --repeat 5 --warmup 1 --op-profile \
        --out "$out/ops-$mode.json" >"$out/ops-$mode.txt" 2>&1
      echo "exit $?"; grep -vE '^ +(fwd|bwd) #' "$out/ops-$mode.txt" | tail -16
    done
  fi
  stamp "done"
}

cmd_bench_attention() {
  # The fused attention in one go: correctness of every attention case against the CPU in float64 (`check`), the
  # timings of tests/gpu/test_cuda_perf.cpp's attention shapes, and PyTorch's scaled_dot_product_attention at the
  # 192/128 shapes as the peer (scripts/bench_sdpa.py); the last lines are the table of src/cuda/NOTES.md.
  gpu_start "${1:-}" bench
  need_bin laga_gpu_tests
  local perf=${2:-CudaPerf.DISABLED_Attention*LongSequences}
  export OUT=$final
  echo "== correctness (CudaAttention*) =="
  timeout 300 bash "$SELF" check "$dist" '*CudaAttention*' | tail -25
  echo
  echo "== timings ($perf) =="
  timeout 300 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests --gtest_filter="$perf" 2>&1 |
    tee "$final/perf.log" | grep -E '^GPUPERF|FAILED|rror'
  echo
  echo "== PyTorch SDPA (192/128) =="
  PYTHONUNBUFFERED=1 timeout 200 python3 scripts/bench_sdpa.py 2>&1 | tee "$final/sdpa.log" | grep -vE '^\s*$' | tail -8
}

cmd_profile() {
  # Nsight Compute on the tensor-core 192/128 attention at h 16, S 8k (the first forward and backward of the perf
  # test's long-sequence run): `fwd` flash_fwd_ws_kernel, `bwd` flash_bwd_ws_kernel (the default), the sections
  # named after it (default: speed of light, compute and memory workload, warp state, scheduler, launch). Clocks
  # are left alone (--clock-control none). Needs a machine where ncu reads the counters. Reports to stdout and
  # profile-<pass>.txt.
  gpu_start "${1:-}" profile
  need_bin laga_gpu_tests
  shift || true
  local pass=${1:-bwd} kernel
  shift || true
  case $pass in
    fwd) kernel=flash_fwd_ws_kernel ;;
    bwd) kernel=flash_bwd_ws_kernel ;;
    *) die "pass '$pass': it must be fwd or bwd" 2 ;;
  esac
  local sections=("$@") args=() s ncu
  (( ${#sections[@]} )) || sections=(SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats SchedulerStats LaunchStats)
  for s in "${sections[@]}"; do args+=(--section "$s"); done
  ncu=$(ncu_path) || die "no ncu on this machine"
  timeout 240 "$ncu" --clock-control none -k "regex:$kernel" -c 1 "${args[@]}" "$dist/laga_gpu_tests"     --gtest_also_run_disabled_tests --gtest_filter='CudaPerf.DISABLED_AttentionMha192LongSequences'     >"$final/profile-$pass.txt" 2>&1
  echo "== $kernel (exit $?)"
  grep -vE '^\s*$|^==PROF==|GPUPERF|^\[|^Note' "$final/profile-$pass.txt" | grep -vE 'Running|gtest' | head -150
}

ncu_path() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1; }
ncu_table() {  # Nsight Compute's --csv metrics, a line each: call number, kernel | metric | unit value
  python3 - "$1" <<'PY'
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
for row in (csv.DictReader(lines[start:]) if start is not None else []):
    print(f"{row['ID']} {row['Kernel Name'].split('(')[0][:60]} | {row['Metric Name']} | {row['Metric Unit']} {row['Metric Value']}")
PY
}

cmd_traffic() {
  # The 192/128 forward's device-memory and L2 traffic where its work order matters (src/cuda/NOTES.md, version
  # 37): Nsight Compute's HBM bytes, L2 bytes and L2 hit rate of laga's forward and cuDNN's in one
  # bench-attention process (its first laga forward, then cuDNN's), at DeepSeek-V3's all_gather rank (P = 8, S =
  # <seqs>, default 16k and 32k) and a2a rank at the largest S -> traffic-<layout>-<S>.csv; then the perf tests
  # timing the forward's and the backward's head groups (DISABLED_AttentionMha192{Forward,Backward}HeadGroups)
  # -> head-groups.txt.
  gpu_start "${1:-}" traffic
  need_bin laga
  need_bin laga_gpu_tests
  shift || true
  local seqs=${1:-16384,32768} ncu S layout csv
  ncu=$(ncu_path) || die "no ncu on this machine"
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
  local shapes=() last=${seqs##*,}
  for S in ${seqs//,/ }; do shapes+=("all_gather $S"); done
  shapes+=("a2a $last")
  for shape in "${shapes[@]}"; do
    read -r layout S <<<"$shape"
    csv=$final/traffic-$layout-$S.csv
    timeout 200 "$ncu" --clock-control none -k 'regex:flash_fwd_ws_kernel|fprop|sdpa' -c 2 --metrics "$metrics" --csv \
      "$dist/laga" bench-attention --model deepseek-v3 --seq "$S" --sp 8 --layout "$layout" --repeat 1 --warmup 0 \
      >"$csv" 2>"$final/traffic-$layout-$S.err"
    echo "== $layout S = $S (exit $?): call, kernel | metric | value"
    ncu_table "$csv"
  done
  echo "== head groups: the perf test"
  timeout 300 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaPerf.DISABLED_AttentionMha192*HeadGroups' >"$final/head-groups.txt" 2>&1
  echo "== head groups (exit $?)"
  grep GPUPERF "$final/head-groups.txt" | awk '{print $2, $(NF-1)}'
}

cmd_traffic_bwd() {
  # The warp-specialised 192/128 backward's HBM and L2 traffic per work order (head group): Nsight Compute on the
  # perf test's deterministic backward (DISABLED_AttentionMha192BackwardHeadGroups, LAGA_PERF_HEAD_GROUPS = the
  # groups, one warm-up and one timed call each) at each shape whose name contains one of <shapes> (default
  # "h16_s32k h128_s8k") -> traffic-bwd-<shape>.csv; then the same test timing each group under sustained load
  # (30 calls after a warm-up, both orders of dQ's sums) -> head-groups-bwd.txt.
  gpu_start "${1:-}" traffic-bwd
  need_bin laga_gpu_tests
  shift || true
  local shapes=${1:-"h16_s32k h128_s8k"} groups=${2:-16,8,4} ncu shape csv n
  ncu=$(ncu_path) || die "no ncu on this machine"
  n=$(( 2 * $(tr ',' '\n' <<<"$groups" | grep -c .) ))
  local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct
  for shape in $shapes; do
    csv=$final/traffic-bwd-$shape.csv
    LAGA_PERF_HEAD_GROUPS=$groups LAGA_PERF_REPS=1 LAGA_PERF_SHAPES=$shape timeout 240 "$ncu" --clock-control none \
      -k 'regex:flash_bwd_ws_kernel' -c "$n" --metrics "$metrics" --csv "$dist/laga_gpu_tests" \
      --gtest_also_run_disabled_tests --gtest_filter='CudaPerf.DISABLED_AttentionMha192BackwardHeadGroups' \
      >"$csv" 2>"$final/traffic-bwd-$shape.err"
    echo "== $shape (exit $?): call (groups $groups, a warm-up and a timed call each), kernel | metric | value"
    ncu_table "$csv"
  done
  echo "== head groups $groups under sustained load (30 calls each)"
  LAGA_PERF_HEAD_GROUPS=$groups LAGA_PERF_REPS=30 timeout 400 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaPerf.DISABLED_AttentionMha192BackwardHeadGroups' >"$final/head-groups-bwd.txt" 2>&1
  echo "== (exit $?)"
  grep GPUPERF "$final/head-groups-bwd.txt" | awk '{print $2, $(NF-1)}'
}

cmd_torch() {
  # laga's PyTorch module on the GPU (scripts/gpu_torch.py): against `laga run --save` for the same weights, and
  # its time and memory beside plain PyTorch and laga run's own block -> torch_gpu.json. The package is imported
  # from <dist>/py when the carried build has one (`pack build py`), else from the machine's Python path.
  gpu_start "${1:-}" torch
  need_bin laga
  shift || true
  torch_python
  torch_cudnn_first
  [ -d "$dist/py" ] && export PYTHONPATH="$dist/py${PYTHONPATH:+:$PYTHONPATH}"
  # The CLI runs in the GPU environment (a wrapper); PyTorch's process keeps the machine's library path, with
  # only the carried OpenBLAS beside it: the toolkit's CUDA libraries ahead of PyTorch's own slow its kernels.
  local cli=$dist/laga_cli.sh
  printf '#!/usr/bin/env bash\nexport LD_LIBRARY_PATH=%q\nexec %q "$@"\n' "$LD_LIBRARY_PATH" "$dist/laga" >"$cli"
  chmod +x "$cli"
  LD_LIBRARY_PATH="$dist/libs${MACHINE_LD_LIBRARY_PATH:+:$MACHINE_LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1 \
    "$python" scripts/gpu_torch.py --cli "$cli" --out "$final/torch_gpu.json" "$@" 2>&1 | tee "$final/torch_gpu.log"
}

# ---------------------------------------------------------------- dispatch

SUB=${1:-help}
shift || true
case $SUB in
  help | -h | --help) usage ;;
  pack | env | check-summary | check | sanitize | run-check | smoke | short | all | multi | overlap | cudnn | \
  block-profile | bench-attention | profile | traffic | traffic-bwd | torch)
    "cmd_${SUB//-/_}" "$@" ;;
  *) echo "gpu.sh: unknown subcommand '$SUB' (bash scripts/gpu.sh help lists them)" >&2; exit 2 ;;
esac
