"""``collected_before_capture``: dead cycles are freed before a capture, never inside it."""

import gc

from serving.device.capture_guard import collected_before_capture


class _Owner:
    """Stands for a dead engine holding a CUDA graph: records when the collector frees it."""

    freed: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name
        self.cycle = self  # only the cycle collector frees it

    def __del__(self) -> None:
        _Owner.freed.append(self.name)


def test_cycles_are_collected_before_the_block_and_not_inside_it():
    _Owner.freed.clear()
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        _Owner("before")  # dead on arrival, in a cycle
        with collected_before_capture():
            assert _Owner.freed == ["before"] and not gc.isenabled()
            _Owner("inside")
            for _ in range(50_000):  # far past the collector's thresholds
                [[]]
            assert _Owner.freed == ["before"]  # the one that died inside waits for the block's end
        assert gc.isenabled()
        gc.collect()
        assert _Owner.freed == ["before", "inside"]
    finally:
        gc.enable() if was_enabled else gc.disable()


def test_the_collector_is_left_as_it_was_even_on_an_error():
    gc.disable()
    try:
        try:
            with collected_before_capture():
                raise RuntimeError("capture failed")
        except RuntimeError:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    try:
        with collected_before_capture():
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert gc.isenabled()
