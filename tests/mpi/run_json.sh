# `laga run --json FILE` under mpirun: rank 0 writes one document with every rank's measurements (saved
# tensors by name, peaks, traffic, FLOPs and seconds by phase), the options, the configuration, the check
# and the machine; the CUDA options are refused on a machine without a GPU, on every rank, before any
# collective.   usage: bash run_json.sh <laga> <mpiexec>
source "$(dirname "$0")/lib.bash"

for np in 2 4; do
  run_mpi "$np" run --model tiny --seq 64 --batch 2 --form laga --layout all_gather --check --json "$TMP/np$np.json"
  if [ "$RC" -ne 0 ]; then
    fail "-np $np laga run --json: exit $RC"
    show_output
    continue
  fi
  if python3 - "$TMP/np$np.json" "$np" <<'PY'; then
import json, sys
d = json.load(open(sys.argv[1]))
P = int(sys.argv[2])
assert d["options"]["sp"] == P and d["options"]["device"] == "cpu", d["options"]
assert d["config"]["hidden_size"] == 32, d["config"]
assert d["machine"]["communicator"] == "mpi" and d["machine"]["commit"] and d["machine"]["hostname"], d["machine"]
assert d["phantom"] is False
(run,) = d["runs"]
assert run["variant"] == "laga" and run["layout"] == "all_gather" and run["dtype"] == "float32", run
assert [r["rank"] for r in run["ranks"]] == list(range(P)), [r["rank"] for r in run["ranks"]]
for r in run["ranks"]:
    assert r["saved_bytes"] == sum(t["bytes"] for t in r["saved"]) > 0
    assert r["bytes_sent"] == sum(t["bytes_sent"] for t in r["traffic"]) > 0
    assert set(r["flops_forward"]) == set(r["seconds_backward"]) == {"projections", "up_projections", "attention", "communication", "other"}
assert all(t["ok"] for c in run["check"] for t in c["tensors"]), run["check"]
PY
    pass "-np $np laga run --check --json: $np ranks in the document"
  else
    fail "-np $np laga run --json: the document is not as expected"
  fi
done

# Without a GPU, --device cuda is refused on every rank (exit 2) before any collective.
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  run_mpi 2 run --model tiny --seq 64 --device cuda
  if [ "$RC" -eq 2 ] && [ "$(count 'laga: error: device = cuda')" -eq 2 ]; then
    pass "-np 2 laga run --device cuda without a GPU -> exit 2 on every rank"
  else
    fail "-np 2 laga run --device cuda without a GPU: exit $RC"
    show_output
  fi
fi
# A phantom rank runs alone.
run_mpi 2 run --model tiny --seq 64 --phantom-rank 1 --sp 2
if [ "$RC" -eq 2 ] && [ "$(count 'launch it without mpirun')" -eq 2 ]; then
  pass "-np 2 laga run --phantom-rank -> exit 2 on every rank"
else
  fail "-np 2 laga run --phantom-rank: exit $RC"
  show_output
fi

finish
