"""What DeepSeek's multi-token-prediction (MTP) module carries from one step to the next.

The ``mtp:WxD`` drafter (``serving.speculation.drafters.MTPDrafter``) drafts with the module the
checkpoint ships (``DeepseekV3Model.mtp_forward``). Its work is split so that most of it rides
on steps the engine runs anyway:

- Every target step of an engine with the drafter (prefill chunks, decode and verify steps)
  also runs the module over the step's rows (``StepBatch.mtp == "after"``): row r pairs the
  target's hidden state at r with the target's own choice after r, so the module's latent row
  for every token that gets accepted is written to the same slot as the target's, and the
  rejected ones' rows go back to the pool with their slots. The module's output at each
  request's last accepted token gives the first level of the next tree (its top-``W``), and
  its output state is kept here for chaining.
- Deeper levels are one chain step of the module alone (``mtp == "chain"``): every chain is
  an entry of ``D - 1`` rows over scratch slots the drafter frees, computed in ``D - 1`` passes
  of one captured step (one plan, one replay, one read), its first row reading the request's
  state here (``hidden_src``).

Decisions:
- State lives in one device tensor indexed by slot-table row: a captured graph reads and
  writes it through index fields of its static buffers, with no host work. Row 0 is the
  table's padding row: padded entries of a bucket read and write it, and nothing real lives
  there.
- The first level's candidates come back to the host with the step's one result read (packed
  with the other integer outputs) and are kept per table row; a row with none (its request has
  not been stepped with the module yet) drafts nothing.
- A request's row is reused after it finishes; prefill overwrites its state before any
  proposal reads it.
"""

from __future__ import annotations

import torch

MAX_MTP_WIDTH = 8  # the widest first level (top-W) a drafter may ask for


class MTPState:
    """hidden: [table rows, hidden] in the model's dtype, the module's output state after each
    row's last token; candidates: table row -> the module's top tokens there."""

    def __init__(self, table_rows: int, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.hidden = torch.zeros(table_rows, hidden_size, dtype=dtype, device=device)
        self.candidates: dict[int, list[int]] = {}
