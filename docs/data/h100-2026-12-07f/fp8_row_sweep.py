"""A wider row-sum sweep for the FP8 one-row cells, merged into the quick pass's measurements;
writes OUT/sweep.json (measurements) and OUT/table-wide.json (the table)."""
import itertools, json, sys
from pathlib import Path
import torch
from phases.backend.bench import stream_gemm as sg
from serving.quant.stream_gemm import StreamConfig

out = Path(sys.argv[1])
base = json.loads(Path("docs/data/h100-2026-12-07e/stream_gemm_tune-quick.json").read_text())
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
from phases.common.roofline import measure_ceilings
bw = measure_ceilings(dev).copy_bw_bytes_per_s
grid = [StreamConfig(bn, bk, w, s, p, False) for bn, bk, w, s, p in
        itertools.product((32, 64, 128), (128, 256), (4, 8), (1, 2, 3, 4), (2 * sms, 4 * sms, 8 * sms))]
cells = []
for c in base["cells"]:
    if c["weight"] != "fp8" or c["rows"] != 1:
        cells.append(c); continue
    old = StreamConfig(**c["choice"])
    new = sg.tune_cell("fp8", c["names"][0], c["n"], c["k"], 1, list(dict.fromkeys([old] + grid)), dev, bw)
    print(json.dumps({"cell": [c["n"], c["k"]], "old_us": c["best_us"], "new": new["choice"], "new_us": new["best_us"],
                      "old_again_us": next((t["us"] for t in new["tried"] if t["config"] == vars(old)), None)}), flush=True)
    cells.append(new)
res = dict(base, cells=cells, copy_bw_bytes_per_s=bw, measured=__import__("datetime").datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"))
(out / "sweep.json").write_text(json.dumps(res, indent=1))
sg.write_table(sg.table_from_measurements(res, "phases/backend/bench/stream_gemm.py's quick pass, the FP8 one-row cells swept wider (docs/data/h100-2026-12-07f/)"), out / "table-wide.json")
print(sg.summary(res))
