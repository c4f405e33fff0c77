#!/usr/bin/env bash
# `laga run` on a GPU machine: the CLI end to end on the device, with a short report.
#
#   scripts/gpu_run_check.sh pack [build-dir]     (here) copy laga, the GPU test binary, the shared libraries
#                                                 a bare GPU machine may lack (OpenBLAS and its Fortran
#                                                 runtime) and this machine's Open MPI (libraries, plugins,
#                                                 launcher: used there only if the machine has no Open MPI
#                                                 of its own) into <build-dir>/dist-run, the folder to carry
#   scripts/gpu_run_check.sh run [dist-dir] [steps]   (there) run the steps named (default 1234), each with
#                                                 its own time limit:
#     1. the GPU communicator tests (tests/gpu/test_nccl.cpp: NCCL and host staging at P = 1, host staging
#        over 2 and 4 thread ranks sharing the GPU);
#     2. `laga run --device cuda --check` at P = 1 for every variant x layout x kernel (bf16), and through
#        NCCL and host staging at P = 1 (--comm);
#     3. phantom rank 7 of 8, DeepSeek-V3, S = 16384, bf16: every variant x layout x kernel in one process,
#        its saved bytes against `laga plan --dtype bfloat16 --json` (must be EQUAL), time by phase, device
#        memory (cudaMemGetInfo);
#     4. `mpirun -np 2|4|8 laga run --device cuda --check` (the ranks share the GPU: MPI with host staging),
#        laga, explicit and absorbed, both layouts, fused and eager, bf16 (and float32 at np 4, fused); the
#        ring (p2p) for laga and explicit, fused, bf16;
#     5. step 4's all_gather bf16 runs with --kv-grad-reduce-in-fp32 (not in the default steps).
#   A summary goes to stdout and $OUT/summary.txt; logs and JSON documents to $OUT/results.tar.gz.
#
# The build: cmake -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-nccl laga laga_gpu_tests
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}

if [[ $mode == pack ]]; then
  build=${2:-build-nccl}
  dist=$build/dist-run
  rm -rf "$dist" && mkdir -p "$dist/libs" "$dist/mpi/bin" "$dist/mpi/lib" "$dist/mpi/share"
  cp "$build/laga" "$build/tests/gpu/laga_gpu_tests" "$dist/"
  ldd "$build/laga" | awk '/=> \// {print $3}' | grep -E 'openblas|gfortran|quadmath|gomp' |
    while read -r lib; do cp -L "$lib" "$dist/libs/"; done
  # Open MPI as installed here (Debian's layout under a prefix, so OPAL_PREFIX relocates it).
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
  du -sh "$dist"; ls "$dist" "$dist/libs"
  exit 0
fi

dist=${2:-build-nccl/dist-run}
dist=$(cd "$dist" && pwd)
steps=${3:-1234}
out=${OUT:-/tmp/laga_gpu_run}
work=$(mktemp -d /tmp/laga_gpu_run.XXXXXX)
mkdir -p "$out"
LAGA=$dist/laga
SUMMARY=$out/summary.txt  # written as the steps go, so a run stopped at its limit still reports
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-4}

# Libraries from the machine (cuBLASLt and NCCL: the toolkit's lib64, or the pip wheels), NVLink multicast off.
. scripts/gpu_env.sh

say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
say "libnccl: $(lib_dirs 'libnccl.so.2*')"
say "system mpirun: $(command -v mpirun || echo none) $( (mpirun --version 2>&1 || true) | head -1)"

# Open MPI: the machine's if laga runs with it (libmpi.so.40, an Open MPI mpirun), else the bundled one.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=""
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
    cat "$work/probe.log" | tail -20 | tee -a "$SUMMARY"
  fi
fi
if ldd "$LAGA" | grep -q 'not found'; then
  say "missing libraries:"; ldd "$LAGA" | grep 'not found' | tee -a "$SUMMARY"
fi

# ---- 1. communicator tests
if [[ $steps == *1* ]]; then
say ""
say "== 1. GPU communicator tests (tests/gpu/test_nccl.cpp)"
NCCL_DEBUG=VERSION timeout 150 "$dist/laga_gpu_tests" --gtest_filter='*GpuComm*:*HostStaging*:*CudaMemInfo*' \
  >"$work/gtest_nccl.log" 2>&1
rc=$?
say "exit $rc; $(grep -m1 -o 'NCCL version [^ ]*' "$work/gtest_nccl.log")"
grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\]' "$work/gtest_nccl.log" | tee -a "$SUMMARY"
grep -B2 -A6 'Failure' "$work/gtest_nccl.log" | head -40 | tee -a "$SUMMARY"
# GPUCHECK HostStagingThreads/<form> <layout> P=<n> <dtype> <tensor> rel_error=<e> tol=<t>
awk '/^GPUCHECK HostStaging/ { k = $2 " " $3 " " $4 " " $5; split($7, e, "=");
       if (!(k in w) || e[2] + 0 > w[k]) { w[k] = e[2] + 0; t[k] = $6 } }
     END { for (c in w) printf "  %-48s worst rel. error %.2e (%s)\n", c, w[c], t[c] }' "$work/gtest_nccl.log" |
  sort | tee -a "$SUMMARY"
fi

# ---- 2. P = 1 with --check
check_table() { python3 scripts/check_table.py "$@"; }  # JSON documents of `laga run --check`
if [[ $steps == *2* ]]; then
say ""
say "== 2. laga run --device cuda --check at P = 1 (model small, S = 256, batch 2, bf16)"
p1=()
for layout in a2a all_gather; do
  for kernel in eager fused; do
    for variant in "explicit" "absorbed --absorbed-attention mqa" "absorbed --absorbed-attention expanded" "laga" \
                   "laga --recompute kv"; do
      tag=p1_$(echo "$variant $layout $kernel" | tr -c 'a-z0-9\n' '_')
      # shellcheck disable=SC2086
      timeout 60 "$LAGA" run --device cuda --model small --seq 256 --batch 2 --form $variant --layout "$layout" \
        --kernel "$kernel" --check --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || echo "  exit $? for $variant $layout $kernel" | tee -a "$SUMMARY"
      p1+=("$work/$tag.json")
    done
  done
done
for form in explicit laga; do  # the ring (p2p): fused only
  tag=p1_${form}_p2p_fused
  timeout 60 "$LAGA" run --device cuda --model small --seq 256 --batch 2 --form "$form" --layout p2p --kernel fused \
    --check --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || echo "  exit $? for $form p2p fused" | tee -a "$SUMMARY"
  p1+=("$work/$tag.json")
done
for comm in nccl host-staging; do
  NCCL_DEBUG=WARN timeout 60 "$LAGA" run --device cuda --comm "$comm" --model small --seq 256 --batch 2 --form laga \
    --check --json "$work/p1_comm_$comm.json" >"$work/p1_comm_$comm.log" 2>&1 || echo "  exit $? for --comm $comm" | tee -a "$SUMMARY"
  p1+=("$work/p1_comm_$comm.json")
done
check_table "${p1[@]}" | tee -a "$SUMMARY"
fi

# ---- 3. phantom rank 7 of 8, DeepSeek-V3, S = 16384
if [[ $steps == *3* ]]; then
say ""
say "== 3. phantom rank 7 of 8: DeepSeek-V3, S = 16384, bf16, every variant x layout x kernel"
start=$(date +%s)
timeout 300 "$LAGA" run --device cuda --model deepseek-v3 --seq 16384 --sp 8 --phantom-rank 7 --form all --layout all --warmup 1 \
  --kernel all --json "$work/phantom_dsv3.json" >"$work/phantom_dsv3.log" 2>&1
rc=$?
say "exit $rc in $(( $(date +%s) - start )) s; $(grep -m1 'phantom rank' "$work/phantom_dsv3.log")"
plans=()
for layout in a2a all_gather; do
  for kernel in eager fused; do
    "$LAGA" plan --model deepseek-v3 --seq 16384 --sp 8 --dtype bfloat16 --layout "$layout" --kernel "$kernel" --json \
      >"$work/plan_dsv3_${layout}_${kernel}.json"
    plans+=("$work/plan_dsv3_${layout}_${kernel}.json")
  done
done
cp "$work/phantom_dsv3.json" "$work/phantom_dsv3.log" "$out/" 2>/dev/null
if [ -s "$work/phantom_dsv3.json" ]; then
  python3 scripts/phantom_vs_plan.py "$work/phantom_dsv3.json" "${plans[@]}" | tee -a "$SUMMARY"
else
  tail -30 "$work/phantom_dsv3.log" | tee -a "$SUMMARY"
fi
fi

# ---- 4. ranks sharing the GPU under mpirun
say ""
if [[ $steps != *4* ]]; then
  :
elif [ -n "$MPIRUN" ]; then
  say "== 4. mpirun -np 2|4|8 laga run --device cuda --check (ranks share the GPU: MPI with host staging)"
  mp=()
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
              --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || echo "  exit $? for $tag" | tee -a "$SUMMARY"
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

# ---- 5. the same with the K/V gradients reduced in float32 (all_gather, bf16)
say ""
if [[ $steps != *5* ]]; then
  :
elif [ -n "$MPIRUN" ]; then
  say "== 5. mpirun -np 2|4|8 laga run --device cuda --check --kv-grad-reduce-in-fp32 (all_gather, bf16)"
  kv=()
  for np in 2 4 8; do
    for kernel in fused eager; do
      for form in laga explicit absorbed; do
        tag=mpi_np${np}_kvfp32_${kernel}_${form}_all_gather
        timeout 90 "$MPIRUN" -np "$np" --bind-to none "$LAGA" run --device cuda --dtype bfloat16 --model small \
          --seq 256 --batch 2 --form "$form" --layout all_gather --kernel "$kernel" --kv-grad-reduce-in-fp32 --check \
          --json "$work/$tag.json" >"$work/$tag.log" 2>&1 || echo "  exit $? for $tag" | tee -a "$SUMMARY"
        kv+=("$work/$tag.json")
      done
    done
  done
  check_table "${kv[@]}" | tee -a "$SUMMARY"
  grep -h -m1 -E 'error|Error|failure' "$work"/mpi_*kvfp32*.log | sort -u | head -5 | tee -a "$SUMMARY"
else
  say "== 5. skipped: no usable mpirun"
fi

tar -czf "$out/results.tar.gz" -C "$work" .
echo "logs and JSON: $out/results.tar.gz"
