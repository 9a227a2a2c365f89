"""H200 check of kernel/hopper.py: correctness vs float64, determinism, then timings vs the Triton path.

Run from a directory holding a copy of ``kernel/``: ``python3 check.py`` (stages run in
subprocesses with timeouts so a hang is reported, not fatal). Logs go to $OUT.
"""
import json, math, os, statistics, subprocess, sys, time

OUT = os.environ.get("OUT", ".")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def log(*a):
    print(*a, flush=True)


def make_case(draft_lens, kv_lens, H, tree, seed, pool_extra=1000):
    import torch
    g = torch.Generator().manual_seed(seed)
    N, total = sum(draft_lens), sum(kv_lens)
    q = (torch.randn(N, H, 576, generator=g) * 0.5).to(torch.bfloat16).cuda()
    pool = total + pool_extra
    kv = (torch.randn(pool, 576, generator=g)).to(torch.bfloat16).cuda()
    idx = torch.randperm(pool, generator=g)[:total].to(torch.int32).cuda()
    qo = torch.tensor([0] + list(__import__("itertools").accumulate(draft_lens)), dtype=torch.int32).cuda()
    kvp = torch.tensor([0] + list(__import__("itertools").accumulate(kv_lens)), dtype=torch.int32).cuda()
    mask = None
    if tree:
        ms = []
        for t in draft_lens:
            parents = [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, t)]
            m = torch.zeros(t, t, dtype=torch.bool)
            for s in range(t):
                u = s
                while u >= 0:
                    m[s, u] = True
                    u = parents[u]
            ms.append(m.flatten())
        mask = torch.cat(ms).cuda()
    return q, kv, qo, kvp, idx, mask


def variants():
    from kernel import hopper
    names = os.environ.get("VARIANTS")
    vs = hopper.VARIANTS
    return [v for v in vs if names is None or v.describe() in names.split(",")]


def stage_correct():
    import torch
    from kernel import hopper
    VARIANTS = variants()
    from kernel.reference import mla_verify_reference
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    scale = 1 / math.sqrt(192)
    cases = [
        ([1], [1], 16, False), ([1], [70000], 16, False), ([8], [4099], 16, True), ([8], [33333], 128, True),
        ([1, 8, 5], [1 + 0, 70001, 777], 16, True), ([8, 1, 3], [65, 12345, 64], 128, False),
        ([64], [2000], 16, True), ([8], [8], 128, True), ([3], [129], 16, False), ([1], [65537], 128, False),
    ]
    ok_all = True
    for i, (T, L, H, tree) in enumerate(cases):
        q, kv, qo, kvp, idx, mask = make_case(T, L, H, tree, seed=100 + i)
        N = q.shape[0]
        ref = mla_verify_reference(q, kv, qo, kvp, idx, mask, scale, compute_dtype=torch.float64, out_dtype=torch.float64)
        for v in VARIANTS:
            plan = hopper.make_plan(T, L, H, sms, v)
            tens = plan.to_device(q.device)
            po, pl = hopper.allocate_workspace(plan.num_work, q.device)
            big = torch.full(((N + 2) * H * 512,), float("nan"), dtype=torch.bfloat16, device="cuda")
            out = big[H * 512 : (N + 1) * H * 512].view(N, H, 512)
            hopper.run_split_and_combine(plan, tens, q, kv, qo, kvp, idx, mask, scale, out, po, pl, variant=v)
            torch.cuda.synchronize()
            first = out.clone()
            out.fill_(float("nan"))
            hopper.run_split_and_combine(plan, tens, q, kv, qo, kvp, idx, mask, scale, out, po, pl, variant=v)
            torch.cuda.synchronize()
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            nan = bool(torch.isnan(out).any())
            margins = bool(torch.isnan(big[: H * 512]).all() and torch.isnan(big[(N + 1) * H * 512 :]).all())
            det = torch.equal(first, out)
            ok = err < 1e-2 and not nan and margins and det
            ok_all &= ok
            log(f"{v.describe()} T={T} L={L} H={H} tree={tree} work={plan.num_work} rel_err={err:.2e} nan={nan} margins_ok={margins} deterministic={det} {'OK' if ok else 'FAIL'}")
    log("CORRECT" if ok_all else "INCORRECT")


def bench(fn, flush, reps=40):
    import torch
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    except Exception as e:  # pragma: no cover
        log("graph capture failed:", repr(e)[:200])
        run = fn
    ts = []
    for _ in range(reps):
        flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); run(); b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def stage_bench():
    import torch
    from kernel import hopper
    VARIANTS = variants()
    from kernel import MLAVerifyWrapper
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flushbuf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty(1, dtype=torch.int64, device="cuda")
    flush = lambda: torch.sum(flushbuf.view(torch.int64), out=sink)
    # ceilings
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    cp = bench(lambda: b.copy_(a), flush, 20)
    bw = 2 * a.numel() / (cp * 1e-6)
    del a, b
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
    mm = bench(lambda: x @ y, lambda: None, 20)
    peak = 2 * 8192 ** 3 / (mm * 1e-6)
    del x, y
    log(f"copy {bw/1e12:.2f} TB/s  mm {peak/1e12:.0f} TFLOP/s")
    scale = 1 / math.sqrt(192)
    shapes = []
    for (H, T) in [(16, 1), (128, 1), (16, 8), (128, 8)]:
        for L in (16384, 65536, 131072):
            shapes.append(([T], [L], H, T > 1))
    shapes += [([1] * 64, [4096] * 64, 16, False), ([1] * 16, [16384] * 16, 128, False),
               ([8] * 8, [1024, 4096, 16384, 65536, 131072, 2048, 8192, 32768], 16, True)]
    rows = []
    for i, (T, L, H, tree) in enumerate(shapes):
        q, kv, qo, kvp, idx, mask = make_case(T, L, H, tree, seed=7 + i, pool_extra=0)
        N = q.shape[0]
        out = torch.empty(N, H, 512, dtype=torch.bfloat16, device="cuda")
        out2 = torch.empty_like(out)
        byts = sum(L) * 576 * 2 + N * H * (576 + 512) * 2
        flops = sum(2 * t * H * l * 1088 for t, l in zip(T, L))
        roof = max(byts / bw, flops / peak) * 1e6
        name = f"B={len(T)} T={T[0] if len(set(T))==1 else 'rag'} H={H} L={L[0] if len(set(L))==1 else 'rag'}"
        w = MLAVerifyWrapper(torch.device("cuda"))
        w.plan(qo, kvp, H)
        t_t = bench(lambda: w.run(q, kv, idx, mask, scale, out2), flush)
        row = {"shape": name, "roof_us": roof, "triton_us": t_t}
        for v in VARIANTS:
            plan = hopper.make_plan(T, L, H, sms, v)
            tens = plan.to_device(q.device)
            po, pl = hopper.allocate_workspace(plan.num_work, q.device)
            f_h = lambda pdl=True: hopper.run_split_and_combine(plan, tens, q, kv, qo, kvp, idx, mask, scale, out, po, pl, use_pdl=pdl, variant=v)
            row[v.describe()] = bench(f_h, flush)
            if v == VARIANTS[0]:
                row["nopdl"] = bench(lambda: f_h(False), flush)
            torch.cuda.synchronize()
            agree = ((out.float() - out2.float()).abs().max() / out2.float().abs().max()).item()
            row["agree_" + v.describe()] = agree
            del po, pl
        rows.append(row)
        log(json.dumps(row))
        del q, kv, out, out2
    json.dump(rows, open(os.path.join(OUT, "bench.json"), "w"))
    names = [v.describe() for v in VARIANTS]
    log("\nfraction = roofline / measured; graph replay median, read-only 256 MB flush")
    log("| shape | roof µs | triton µs (frac) | " + " | ".join(f"{n} µs (frac)" for n in names) + " | no-PDL µs |")
    log("|---" * (4 + len(names)) + "|")
    for r in rows:
        cells = " | ".join(f"{r[n]:.1f} ({r['roof_us']/r[n]:.2f})" for n in names)
        log(f"| {r['shape']} | {r['roof_us']:.1f} | {r['triton_us']:.1f} ({r['roof_us']/r['triton_us']:.2f}) | {cells} | {r['nopdl']:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        {"correct": stage_correct, "bench": stage_bench}[sys.argv[1]]()
        sys.exit(0)
    limits = {"correct": int(os.environ.get("T_CORRECT", 120)), "bench": int(os.environ.get("T_BENCH", 200))}
    for stage, lim in limits.items():
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, stage], timeout=lim)
            log(f"== stage {stage}: rc={r.returncode} in {time.time()-t0:.0f}s")
        except subprocess.TimeoutExpired:
            log(f"== stage {stage}: TIMEOUT after {lim}s")
