# The worst relative error per suite, output and dtype from the GPUCHECK lines of the GPU tests
# (scripts/gpu_check.sh). Fields are found by their key, not their position, since the lines differ in
# how many words they carry:
#   GPUCHECK <Suite>/<Case>.<Test>/<param> <tensor> <dtype> rel_err=<e> tol=<t>     (gpu_test_util.hpp report)
#   GPUCHECK LagaVsExplicitSameP/<layout> <kernel> [kv-grad-fp32] P=<n> worst_rel_error=<e>  (test_nccl.cpp)
# Lines with neither key (scratch, bitwise flags) are not errors and are skipped.
#   usage: awk -f gpu_check_summary.awk gpu_checks.txt
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
