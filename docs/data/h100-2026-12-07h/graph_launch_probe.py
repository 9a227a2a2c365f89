"""Host cost of one CUDA graph replay against its kernel count (straight-line graphs of tiny kernels):
alone, and queued back to back; and the device time per replay. Prints each row; writes JSON to argv[1]."""
import json, sys, time
import torch

dev = torch.device("cuda")
x = torch.randn(1024, device=dev)
rows = []
for n in (1, 16, 64, 128, 208, 320, 512, 1024):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = x
            for _ in range(n):
                y = y.mul(1.0001)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y = x
        for _ in range(n):
            y = y.mul(1.0001)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    host = []
    for _ in range(50):
        t0 = time.perf_counter(); g.replay(); host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    # back to back, host-queued (the host runs ahead of the device)
    t0 = time.perf_counter()
    for _ in range(50):
        g.replay()
    queued = (time.perf_counter() - t0) / 50
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); [g.replay() for _ in range(20)]; e1.record(); torch.cuda.synchronize()
    host.sort()
    rows.append(dict(kernels=n, replay_host_us_median=host[len(host)//2]*1e6, replay_host_us_queued=queued*1e6,
                     device_us_per_replay=e0.elapsed_time(e1)/20*1e3))
    print(rows[-1], flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda, rows=rows), open(sys.argv[1], "w"), indent=1)
