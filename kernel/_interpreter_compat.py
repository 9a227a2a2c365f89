"""Make Triton 3.6's CPU interpreter work with NumPy >= 2.4.

In the interpreter a scalar loaded with ``tl.load`` is a one-element NumPy array, and using
it as a loop bound calls ``int(array)``, which NumPy 2.4 turned from a deprecation warning
into a ``TypeError`` ("only 0-dimensional arrays can be converted to Python scalars").
Loop bounds read from memory are the heart of the split kernel, so while interpreting we
extend the interpreter's ``tensor.__index__`` patch to unwrap one-element arrays. The GPU
path is untouched.
"""

from __future__ import annotations


def _index(self) -> int:
    data = self.handle.data
    return int(data.reshape(-1)[0]) if data.size == 1 else int(data)


def install() -> None:
    """Wrap ``triton.runtime.interpreter._patch_lang_tensor`` once (idempotent)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_mla_gate_compat", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patch_lang_tensor._mla_gate_compat = True
    interpreter._patch_lang_tensor = patch_lang_tensor
