"""Host time of the demo engine's graph replays alone (plain decode and the mtp:4x3 buckets), against a
straight-line graph's ~5 us: is the replay's host cost the graph's launch or torch's wrapper?"""
import json, sys, time
import torch
sys.path.insert(0, ".")
from phases.speculation.bench.step_cost import probe_model, probe_engine

dev = torch.device("cuda")
model = probe_model(dev, tiny=False)
out = {}
for spec in (None, "mtp:4x3"):
    eng = probe_engine(model, spec, 4096, (1,))
    req = eng.add_request(list(range(1, 2049)), 64)
    eng.prefill(req)
    for _ in range(6):
        eng.step([req])
    torch.cuda.synchronize()
    graphs = eng.runner.graphs
    for key, cap in graphs.graphs.items():
        if cap.graph is None:
            continue
        g = cap.graph
        host, raw = [], []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter(); g.replay(); host.append(time.perf_counter() - t0)
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter(); torch._C._CUDAGraph.replay(g); raw.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        host.sort(); raw.sort()
        name = f"{spec}:{key}"
        out[name] = dict(replay_us=host[15] * 1e6, c_replay_us=raw[15] * 1e6)
        print(name, out[name], flush=True)
    del eng
json.dump(out, open(sys.argv[1], "w"), indent=1)
