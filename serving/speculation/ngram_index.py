"""Where each n-gram of a request's history starts, kept up to date as the history grows, so a
prompt-lookup draft costs the step's new tokens, not a scan of the whole context.

Decisions:
- One index per request, extended with only the tokens it has not seen (the prompt once, then
  each step's emitted tokens): a 16k context costs one pass, not one per step.
- Lookups return the latest occurrences first (as a backwards scan would), and never the
  history's own final n-gram, which has no continuation yet.
- ``NgramIndexes`` keys indexes by request id and drops those not used for ``idle_calls``
  lookups (requests that finished); an index whose recorded tokens disagree with the history
  it is asked about (an id reused by another request) is rebuilt.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Start positions of every n-gram of ``min_n`` .. ``max_n`` tokens of one history."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.starts: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_n, max_n + 1)}

    def extend(self, new: Sequence[int]) -> None:
        tokens = self.tokens
        for t in new:
            tokens.append(int(t))
            end = len(tokens)
            for n, table in self.starts.items():
                if end >= n:
                    table.setdefault(tuple(tokens[end - n : end]), []).append(end - n)

    def continuations(self, width: int, depth: int) -> list[list[int]]:
        """Up to ``width`` distinct continuations (of up to ``depth`` tokens) of the latest earlier
        occurrences of the history's last n tokens, for n = max_n down to min_n."""
        tokens, found = self.tokens, []
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            own = len(tokens) - n
            for start in reversed(self.starts[n].get(tuple(tokens[own:]), ())):
                if start == own:
                    continue
                cont = tokens[start + n : start + n + depth]
                if cont and cont not in found:
                    found.append(cont)
                    if len(found) >= width:
                        return found
        return found


class NgramIndexes:
    """One ``NgramIndex`` per request id, synced with the request's prompt and output."""

    def __init__(self, min_n: int, max_n: int, idle_calls: int = 1024) -> None:
        self.min_n, self.max_n, self.idle_calls = min_n, max_n, idle_calls
        self._indexes: dict[int, NgramIndex] = {}
        self._last_use: dict[int, int] = {}
        self._calls = 0

    def __len__(self) -> int:
        return len(self._indexes)

    def synced(self, req_id: int, prompt: Sequence[int], output: Sequence[int]) -> NgramIndex:
        """The index of ``prompt + output`` (extended with what it lacks, or rebuilt)."""
        self._calls += 1
        index = self._indexes.get(req_id)
        seen = 0 if index is None else len(index.tokens)
        total = len(prompt) + len(output)
        if index is None or seen > total or (seen and _at(prompt, output, seen - 1) != index.tokens[-1]) \
                or (seen and index.tokens[0] != _at(prompt, output, 0)):
            index, seen = NgramIndex(self.min_n, self.max_n), 0
            self._indexes[req_id] = index
        if seen < len(prompt):
            index.extend(prompt[seen:])
            seen = len(prompt)
        index.extend(output[seen - len(prompt) :])
        self._last_use[req_id] = self._calls
        if self._calls % 64 == 0:
            self._drop_idle()
        return index

    def _drop_idle(self) -> None:
        for rid in [r for r, used in self._last_use.items() if used < self._calls - self.idle_calls]:
            del self._indexes[rid], self._last_use[rid]


def _at(prompt: Sequence[int], output: Sequence[int], i: int) -> int:
    return int(prompt[i]) if i < len(prompt) else int(output[i - len(prompt)])
