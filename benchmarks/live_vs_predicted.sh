#!/bin/bash
# Live against predicted (docs/validation.md): the first 300 requests of the embedded Azure
# 2023 conversation slice through `fleetsim emulate` + `fleetsim load` and through
# `fleetsim run`, with the front end measured on a different slice (rows 300-399) and then
# included in the simulator. Real time: about 3 minutes. Usage: benchmarks/live_vs_predicted.sh OUT
set -eu
cd "$(dirname "$0")/.."
FS=.venv/bin/fleetsim
OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"

emulate() {  # $1: record file; sets EMU (pid) and URL
  $FS emulate --record "$1" > "$OUT/emulate.txt" 2>&1 &
  EMU=$!
  for _ in $(seq 150); do grep -q http "$OUT/emulate.txt" && break; sleep 0.2; done
  URL=$(grep -o 'http://[0-9.:]*' "$OUT/emulate.txt" | head -1)
}

.venv/bin/python - "$OUT/calib.jsonl" <<'PY'
import json, sys
from fleetsim.workloads import load_trace
w = load_trace("embedded:azure_conv_2023")
a0 = float(w.arrival_s[300])
with open(sys.argv[1], "w") as f:
    for i in range(300, 400):
        f.write(json.dumps({"arrival_s": float(w.arrival_s[i]) - a0,
                            "prompt_tokens": int(w.num_prompt_tokens[i]),
                            "output_tokens": int(w.num_output_tokens[i])}) + "\n")
PY
uptime | tee "$OUT/load_average.txt"
emulate "$OUT/calib_emu.jsonl"
$FS load "$OUT/calib.jsonl" --url "$URL" --out "$OUT/calib_live.jsonl" --json > /dev/null
kill -INT $EMU; wait $EMU
emulate "$OUT/emu.jsonl"
$FS load embedded:azure_conv_2023 --url "$URL" --max-requests 300 --out "$OUT/live.jsonl" --json \
    > "$OUT/load.json"
kill -INT $EMU; wait $EMU
uptime | tee -a "$OUT/load_average.txt"
$FS run --set "workload.trace=\"$OUT/calib.jsonl\"" --out "$OUT/calib_sim" --force --json > /dev/null
$FS compare "$OUT/calib_live.jsonl" "$OUT/calib_sim" --engine "$OUT/calib_emu.jsonl" --json \
    > "$OUT/calib_compare.json"
FE=$(.venv/bin/python -c "import json, sys; print(round(json.load(open(sys.argv[1]))
    ['frontend_overhead_s']['mean'], 4))" "$OUT/calib_compare.json")
echo "front end measured on rows 300-399: $FE s"
$FS run --set workload.max_requests=300 --out "$OUT/sim" --force --json > /dev/null
$FS run --set workload.max_requests=300 --set cluster.frontend_overhead_s="$FE" \
    --out "$OUT/sim_fe" --force --json > /dev/null
$FS compare "$OUT/live.jsonl" "$OUT/sim" --engine "$OUT/emu.jsonl"
$FS compare "$OUT/live.jsonl" "$OUT/sim_fe"
$FS compare "$OUT/emu.jsonl" "$OUT/sim"
