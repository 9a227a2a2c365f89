"""What the benchmark times: (H, T) shapes, contexts, the ragged batch, the batched decode rows and
the rows it also times FlashMLA and FlashInfer on; the class of a row by its packed rows (``bound_class``)."""

from __future__ import annotations

HEAD_DIM, V_HEAD_DIM = 576, 512  # DeepSeek-V3 MLA: 512 latent + 64 rope; V is the latent part
MEMORY_BOUND_MAX_ROWS = 64  # packed rows H*T: the classes of bound_class
COMPUTE_BOUND_MIN_ROWS = 256

BENCH_SHAPES = ((16, 1), (128, 1), (8, 8), (16, 8), (64, 8), (128, 8), (16, 32), (64, 32))  # (H, T), B=1
DEFAULT_CONTEXTS = (4096, 16384, 65536, 131072, 262144)
QUICK_CONTEXTS = (65536, 131072)

BATCH8_SHAPE = (16, 8)  # (H, T) of the ragged batch
BATCH8_CONTEXTS = (1024, 2011, 4093, 8209, 16411, 32771, 65539, 131072)  # ragged, 1k..128k

# Serving decode batches (T=1), gated at 16k (min_frac_decode_16k): (B, H, L) per row.
DECODE_BATCHES = (16, 64)
DECODE_HEADS = (16, 128)
DECODE_CONTEXTS = (4096, 16384)

# The peer comparison (phases.kernel.bench.peers): B=1 rows of these (H, T) at these contexts, every
# decode row and the ragged batch; 17 rows, each also a row of the sweep, the decode rows or the batch.
PEER_B1_SHAPES = ((16, 1), (128, 1), (16, 8), (128, 8))  # (H, T): memory, mid, mid, compute
PEER_B1_CONTEXTS = (16384, 65536)

COMPARISON_CONTEXT = 65536
TREE_COMPARISON_SHAPE = (16, 8)
LAYOUT_COMPARISON_SHAPE = (16, 1)


def decode_batch_shapes() -> list[tuple[int, int, int]]:
    """Every (B, H, L) decode row, in report order."""
    return [(b, h, ctx) for b in DECODE_BATCHES for h in DECODE_HEADS for ctx in DECODE_CONTEXTS]


def bound_class(packed_rows: int) -> str:
    """``memory`` for H*T <= 64, ``compute`` for H*T >= 256, ``mid`` in between."""
    if packed_rows <= MEMORY_BOUND_MAX_ROWS:
        return "memory"
    if packed_rows >= COMPUTE_BOUND_MIN_ROWS:
        return "compute"
    return "mid"


def context_label(context: int) -> str:
    """``65536 -> "64k"``; contexts that are not a multiple of 1024 keep their digits."""
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)
