# Bitwise reruns under mpirun: the same `mpirun -np 4 laga run ... --save DIR` twice writes byte-identical
# .npy files, both layouts, LAGA and explicit.   usage: bash bitwise_rerun.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

same_files() {
  diff -q <(cd "$1" && ls) <(cd "$2" && ls) >/dev/null || return 1
  local f
  for f in "$1"/*.npy; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
  return 0
}

for layout in a2a all_gather; do
  for form in explicit laga; do
    args=(run --model small --seq 64 --form "$form" --layout "$layout")
    ok=1
    for run in a b; do
      run_mpi 4 "${args[@]}" --save "$TMP/$form-$layout.$run"
      [ "$RC" -eq 0 ] || { fail "-np 4 laga ${args[*]}: exit $RC"; show_output; ok=0; break; }
    done
    [ "$ok" -eq 1 ] || continue
    if same_files "$TMP/$form-$layout.a" "$TMP/$form-$layout.b"; then
      pass "-np 4 laga ${args[*]} --save twice: byte-identical"
    else
      fail "-np 4 laga ${args[*]} --save twice: the files differ"
    fi
  done
done
finish
