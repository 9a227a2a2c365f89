"""The step profiler (``serving.stack.profile``, ``python -m serving profile``): the kernel
classifier on real kernel names, the streaming limit's byte count against the model's own
tensors, the trace summary, the command line's refusals, and a CPU run of the whole path."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from serving.engine.tp_launch import generated_tokens
from serving.model.presets import preset_config, random_model
from serving.parallel.group import TensorParallel
from serving.quant.fp8 import BlockFP8Weight
from serving.stack import cli
from serving.stack import profile as sp

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs, CUPTI kernels)")

# Kernel names as torch.profiler reports them on an H200 (cuBLAS / cuBLASLt, CUTLASS, cuDNN, the
# project's Triton and Gluon kernels, PyTorch's own), with the class each must land in.
REAL_NAMES = [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "GEMM"),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_TNN", "GEMM"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>"
     "(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float const*, "
     "float const*, __nv_bfloat16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*)", "GEMM"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "GEMM"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false, "
     "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, "
     "cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float> >"
     "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, "
     "cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>, "
     "float, float)", "GEMM"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x64x64_1x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma",
     "GEMM"),
    ("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_stages_64x5_tn", "GEMM"),
    ("_w8_stream_kernel", "GEMM"),
    ("_mla_verify_hopper_split_kernel", "attention"),
    ("_mla_verify_hopper_keys_as_m_kernel", "attention"),
    ("_mla_verify_hopper_seesaw_kernel", "attention"),
    ("_mla_verify_split_kernel", "attention"),
    ("_mla_verify_combine_kernel", "split merge"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x64x128_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<192, 128, 64, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<192, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>"
     "(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)", "attention"),
    ("_rms_norm_kernel", "norm/rope/act/add"),
    ("_rope_kernel", "norm/rope/act/add"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >"
     "(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "norm/rope/act/add"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::"
     "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
     "at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() "
     "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)", "norm/rope/act/add"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
     "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >"
     "(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
     "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
     "at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
     "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<"
     "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)::"
     "{lambda(int)#1})", "norm/rope/act/add"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, "
     "std::array<char*, 2ul> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
     "operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)", "copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::OpaqueType<2u>, "
     "unsigned int, 2, 128, 1>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::"
     "CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, "
     "at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)", "copy"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_copy_kernel_impl"
     "<at::native::OpaqueType<2> >(at::TensorIterator&, long, long, long)::{lambda(char*, char*, long)#1}>"
     "(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(int)#1}>(long, ...)", "copy"),
    ("Memcpy HtoD (Pinned -> Device)", "copy"),
    ("Memcpy DtoH (Device -> Pinned)", "copy"),
    ("Memset (Device)", "copy"),
    ("_move_rows_kernel", "copy"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("_build_kv_indices_kernel", "other"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4> >"
     "(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)", "other"),
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
     "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16, "
     "unsigned int>, at::cuda::detail::TensorInfo<long, unsigned int>, int, int, unsigned int, long)", "other"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, unsigned int>, "
     "unsigned int, unsigned int, bool, unsigned int, unsigned int, at::cuda::detail::TensorInfo<float, unsigned int>, "
     "unsigned int, at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int, unsigned int*)", "other"),
    ("aten::linear", "GEMM"),
    ("aten::bmm", "GEMM"),
    ("aten::cat", "copy"),
    ("aten::add_", "norm/rope/act/add"),
]


@pytest.mark.parametrize(("name", "cls"), REAL_NAMES, ids=[n[:40] for n, _ in REAL_NAMES])
def test_the_classifier_puts_real_kernel_names_in_their_class(name, cls):
    assert sp.classify(name) == cls


def test_every_class_of_the_table_is_reported_and_unknown_names_are_other():
    assert sp.CLASSES == ("split merge", "attention", "GEMM", "collective", "copy", "norm/rope/act/add", "other")
    assert {cls for _, cls in REAL_NAMES} == set(sp.CLASSES)
    assert sp.classify("some_new_kernel") == "other"
    assert sp.classify("_MLA_VERIFY_COMBINE_KERNEL") == "split merge"  # case does not matter


# ---- the streaming limit's bytes ------------------------------------------------------------


def read_bytes_of(model, batch: int) -> float:
    """What a decode step of ``batch`` tokens reads, counted from the tensors the model holds: every
    entry of its weights (views counted by their own size, so a fused pair is counted once through
    its parts) but the embeddings and ``kv_b_proj`` (decode reads its absorbed W_UK / W_UV), the
    absorbed matrices, the stacked experts at the share of experts the batch touches, and the head."""
    cfg = model.cfg

    def size(t) -> int:
        if isinstance(t, BlockFP8Weight):
            return t.nbytes
        return t.numel() * t.element_size()

    total = 0.0
    for name, t in model.w.items():
        if name == "model.embed_tokens.weight" or name.endswith("kv_b_proj.weight"):
            continue
        total += size(t)
    total += sum(size(t) for t in model.w_uk + model.w_uv)
    share = sp.expected_experts(cfg.n_routed_experts, cfg.num_experts_per_tok, batch) / cfg.n_routed_experts
    for gate_up, down in model.experts.values():
        total += share * (size(gate_up) + size(down))
    if "lm_head.weight" not in model.w:
        total += size(model.lm_head)
    return total


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_weight_bytes_from_the_config_match_the_tiny_models_own_tensors(batch):
    model = random_model("tiny")
    assert model.experts and model.fused  # the count covers the MoE layer and the fused projections
    assert sp.weight_bytes(model.cfg, torch.float32, batch=batch) == pytest.approx(read_bytes_of(model, batch), abs=2)


@pytest.mark.parametrize("rank", [0, 1])
def test_weight_bytes_of_one_tensor_parallel_rank_match_its_shards(rank):
    tp = TensorParallel(rank=rank, size=2, group=object())  # the shards only: no collective runs
    model = random_model("tiny", tp=tp)
    assert sp.weight_bytes(model.cfg, torch.float32, batch=3, tp_size=2) == pytest.approx(read_bytes_of(model, 3), abs=2)


def test_the_limit_of_dsv3_tp8_is_the_issues_figures():
    """10.97 GB of weights; latent rows 576 x 2 bytes x 61 layers per token; at 4.22 TB/s the limit
    is 3.69 ms at 64k and 5.75 ms at 185k (the H200 figures of 2026-12-02)."""
    cfg = preset_config("dsv3-tp8")
    assert sp.weight_bytes(cfg, torch.bfloat16) == pytest.approx(10.97e9, rel=1e-3)
    assert sp.kv_bytes(cfg, [65536], torch.bfloat16) == 65536 * 61 * 576 * 2
    assert sp.step_bytes(cfg, [65536], torch.bfloat16, torch.bfloat16).limit_s(4.22e12) * 1e3 == pytest.approx(3.69, abs=0.01)
    assert sp.step_bytes(cfg, [189440], torch.bfloat16, torch.bfloat16).limit_s(4.22e12) * 1e3 == pytest.approx(5.75, abs=0.01)
    b8 = sp.step_bytes(cfg, [65536] * 8, torch.bfloat16, torch.bfloat16)
    assert b8.weights == sp.weight_bytes(cfg, torch.bfloat16) and b8.kv == 8 * 65536 * 61 * 576 * 2  # a dense model
    fp8 = sp.weight_bytes(preset_config("dsv3-tp8-fp8"), torch.bfloat16, fp8=True)
    assert 0.5 * 10.97e9 < fp8 < 0.55 * 10.97e9  # one byte per projection element, bf16 kv_b and head


def test_expected_experts_is_top_k_for_one_token_and_every_expert_for_many():
    assert sp.expected_experts(256, 8, 1) == pytest.approx(8)
    assert sp.expected_experts(256, 8, 1000) == pytest.approx(256)
    assert 8 < sp.expected_experts(256, 8, 4) < 32
    assert sp.expected_experts(0, 8, 4) == 0.0


def test_weight_bytes_refuses_a_batch_or_tp_size_below_one():
    with pytest.raises(ValueError, match="Expected batch >= 1 and tp_size >= 1, got batch 0"):
        sp.weight_bytes(preset_config("tiny"), torch.float32, batch=0)


# ---- the trace summary --------------------------------------------------------------------


def event(name, start, dur, cuda=True, parent=None):
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU,
                           time_range=SimpleNamespace(start=start, elapsed_us=lambda: dur), cpu_parent=parent)


def test_summarize_counts_per_step_by_class_and_busy_time_as_a_union():
    kernels = [sp.Kernel("nvjet_tst_64x8", 0, 10), sp.Kernel("_mla_verify_hopper_split_kernel", 10, 20),
               sp.Kernel("_mla_verify_combine_kernel", 30, 5), sp.Kernel("ncclDevKernel_AllReduce", 32, 6),  # overlaps
               sp.Kernel("nvjet_tst_64x8", 100, 10), sp.Kernel("_mla_verify_hopper_split_kernel", 110, 20),
               sp.Kernel("_mla_verify_combine_kernel", 130, 5), sp.Kernel("_rms_norm_kernel", 135, 1)]
    s = sp.summarize(kernels, 2, {"GEMM": 1000, "attention": 4000})
    assert s.kernels == 4 and s.busy_us == pytest.approx((38 + 36) / 2)
    assert s.classes["GEMM"].kernels == 1 and s.classes["GEMM"].gpu_us == 10
    assert s.classes["GEMM"].GBps == pytest.approx(1000 / 10e-6 / 1e9)
    assert s.classes["attention"].GBps == pytest.approx(4000 / 20e-6 / 1e9)
    assert s.classes["split merge"].bytes is None and s.classes["split merge"].GBps is None
    assert s.classes["collective"].kernels == 0.5 and s.classes["other"].kernels == 0
    assert s.top[0] == ("_mla_verify_hopper_split_kernel", "attention", 1.0, 20.0)
    with pytest.raises(ValueError, match="Expected steps >= 1, got 0"):
        sp.summarize(kernels, 0)


def test_kernels_of_a_trace_are_its_cuda_events_or_on_a_cpu_its_top_level_operators():
    parent = object()
    events = [event("aten::linear", 0, 5, cuda=False), event("aten::addmm", 1, 4, cuda=False, parent=parent),
              event("cudaGraphLaunch", 6, 1, cuda=False), event("nvjet_tst", 10, 3)]
    assert [k.name for k in sp.kernels_of(events, cuda=True)] == ["nvjet_tst"]
    assert [k.name for k in sp.kernels_of(events, cuda=False)] == ["aten::linear", "cudaGraphLaunch"]
    assert sp.kernels_of(events, cuda=True)[0] == sp.Kernel("nvjet_tst", 10.0, 3.0)


def test_decode_row_and_its_tables():
    need = sp.StepBytes(weights=4_000_000, kv=2_000_000)
    kernels = [sp.Kernel("nvjet_tst", 0, 600), sp.Kernel("_mla_verify_split_kernel", 600, 300)]
    row = sp.decode_row([100, 120], need, [[2e-3, 2e-3, 3e-3], [4e-3]], [1.5e-3, 1.5e-3], kernels, 1, 6e9)
    assert row["batch"] == 2 and row["context"] == 100 and row["context_max"] == 120
    assert row["limit_ms"] == pytest.approx(1.0) and row["step_ms"] == pytest.approx(2.5)
    assert row["frac_streaming_limit"] == pytest.approx(0.4) and row["frac_samples"] == pytest.approx([0.5, 0.25])
    assert row["tokens_per_s"] == pytest.approx(800) and row["busy_share"] == pytest.approx(0.9 / 2.5)
    assert row["classes"]["GEMM"]["GBps"] == pytest.approx(4e6 / 600e-6 / 1e9)
    table = sp.markdown(row, title="64k")
    assert table.startswith("### 64k") and "| GEMM | 1 | 600 | 0.67 | 0.00 | 7 |" in table
    assert "| other |" not in table  # classes with no kernel are left out
    assert "`nvjet_tst` | GEMM | 1 | 600 |" in sp.top_kernels_markdown(row)


# ---- the command line ---------------------------------------------------------------------


def run_cli(capsys, *args):
    code = cli.main(["profile", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def nothing_allocated(monkeypatch):
    """Any measurement or model load fails the test: refusals must come before them."""
    def refuse(*args, **kwargs):
        raise AssertionError("allocated before refusing")

    monkeypatch.setattr(sp, "copy_bandwidth", refuse)
    monkeypatch.setattr(cli, "load_model", refuse)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--steps", 0), "Expected --steps >= 1 (engine steps timed), got 0"),
        (("--batch-size", 0), "Expected --batch-size >= 1 (requests decoded together), got 0"),
        (("--random-prompt", -4), "Expected --random-prompt >= 1 (context tokens of each request), got -4"),
        (("--warmup", -1), "Expected --warmup >= 0 (engine steps before the timed ones), got -1"),
        (("--trace-steps", 0), "Expected --trace-steps >= 1 (engine steps traced), got 0"),
        (("--prefill-chunk", 0), "Expected --prefill-chunk >= 1 (prompt tokens per prefill forward), got 0"),
        (("--copy-mib", 0), "Expected --copy-mib >= 1 (MiB per buffer of the bandwidth copy), got 0"),
        (("--seed", -1), "Expected --seed in [0, 2**63), got -1"),
        (("--random-prompt", 4090), "Expected --random-prompt plus the profiled steps (4090 + 28) below the model's "
                                    "max_position_embeddings (4096), got 4119; lower --random-prompt or --steps"),
        (("--device", "mps"), "Expected --device cpu, cuda or cuda:N, got 'mps'"),
        (("--cuda-graphs",), "Expected --cuda-graphs with the kernel backend on a CUDA device, got backend reference on cpu"),
    ],
)
def test_bad_flags_are_refused_with_one_line_before_anything_is_allocated(capsys, nothing_allocated, args, message):
    code, out, err = run_cli(capsys, "--random-model", "tiny", "--device", "cpu", *args)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"error: {message}"]


def test_an_output_path_that_cannot_be_written_is_refused_before_anything_is_allocated(capsys, nothing_allocated, tmp_path):
    code, _, err = run_cli(capsys, "--random-model", "tiny", "--out", tmp_path)
    assert code == 2 and err == f"error: Expected --out FILE, got the folder '{tmp_path}'; name a file in it\n"
    missing = tmp_path / "no" / "prof.json"
    code, _, err = run_cli(capsys, "--random-model", "tiny", "--out", missing)
    assert code == 2 and err == (f"error: Expected --out FILE in an existing folder, got '{missing}' "
                                 f"(no folder '{missing.parent}'); create it first\n")


def test_a_model_folder_that_is_not_there_is_refused(capsys, nothing_allocated, tmp_path):
    code, _, err = run_cli(capsys, "--model", tmp_path / "absent")
    assert code == 2 and err.startswith("error: ") and "absent" in err


def test_a_cpu_profile_of_the_tiny_preset_runs_the_whole_path(capsys, tmp_path):
    out = tmp_path / "prof.json"
    code, stdout, err = run_cli(capsys, "--random-model", "tiny", "--random-prompt", 48, "--batch-size", 2, "--warmup", 1,
                                "--steps", 3, "--trace-steps", 2, "--copy-mib", 4, "--out", out)
    assert code == 0, err
    lines = stdout.rstrip("\n").splitlines()
    assert lines[0].startswith("tiny on cpu, float32, backend reference, eager steps: B=2 at 48 tokens of context:")
    header = lines.index("| class | kernels/step | GPU µs/step | share of busy | bytes/step (GB) | GB/s |")
    assert lines.index(next(l for l in lines if l.startswith("| B | context |"))) < header
    assert all(line.startswith("|") for line in lines[header:])  # the class table comes last
    row = json.loads(out.read_text())
    assert row["batch"] == 2 and row["context"] == 49 and row["prompt_tokens"] == 48  # 48 rows, one warm-up step
    assert len(row["step_ms_samples"]) == 3 and row["ttft_s"] is None and row["replay_ms"] is None
    cfg = preset_config("tiny")
    assert row["weight_GB"] * 1e9 == sp.weight_bytes(cfg, torch.float32, batch=2)
    assert row["kv_GB"] * 1e9 == sp.kv_bytes(cfg, [50, 50], torch.float32)  # 49 cached rows and the new one
    assert sum(c["kernels"] for c in row["classes"].values()) == pytest.approx(row["kernels_per_step"])
    # on a CPU the "kernels" are operators timed on the host, slower under the profiler than in
    # the timed steps, so their busy share may pass 1: only its presence is checked here
    assert row["classes"]["GEMM"]["kernels"] > 0 and row["busy_share"] > 0
    assert [len(o) for o in row["outputs"]] == [1 + 1 + 3 + 2] * 2


def test_a_prefilled_cpu_profile_reports_its_time_to_first_token(capsys):
    code, stdout, err = run_cli(capsys, "--random-model", "tiny", "--random-prompt", 40, "--batch-size", 2, "--warmup", 0,
                                "--steps", 1, "--trace-steps", 1, "--copy-mib", 1, "--prefill", "--prefill-chunk", 16)
    assert code == 0, err
    assert "time to first token: " in stdout and "(prefill of 40 tokens)" in stdout


def test_generate_still_runs_through_the_same_entry_point(capsys):
    code = cli.main(["generate", "--random-model", "tiny", "--prompt", "1,2", "--max-new-tokens", "2"])
    assert code == 0 and "[0] (2 prompt tokens)" in capsys.readouterr().out


def test_the_ranks_of_a_profile_agree_on_every_requests_tokens():
    assert cli.profiled_tokens({"outputs": [[5, 6], [7]]}) == [5, 6, -1, 7, -1]
    assert generated_tokens({"requests": [{"output": [5, 6]}, {"output": [7]}]}) == [5, 6, -1, 7, -1]


@gpu
@needs_cuda
def test_a_gpu_profile_classes_the_replayed_steps_kernels(capsys, tmp_path):
    out = tmp_path / "prof.json"
    code, stdout, err = run_cli(capsys, "--random-model", "gpu-h16", "--random-prompt", 4096, "--steps", 10,
                                "--copy-mib", 256, "--out", out)
    assert code == 0, err
    row = json.loads(out.read_text())
    layers = preset_config("gpu-h16").num_hidden_layers
    assert row["cuda_graphs"] and row["replay_ms"] is not None and row["replay_ms"] <= row["step_ms"] * 1.05
    assert row["classes"]["attention"]["kernels"] >= layers and row["classes"]["GEMM"]["kernels"] >= 5 * layers
    assert row["classes"]["attention"]["GBps"] is not None and row["classes"]["GEMM"]["GBps"] is not None
    assert 0 < row["busy_share"] <= 1.05 and 0 < row["frac_streaming_limit"] <= 1.05
    assert row["copy_GBps"] > 100
