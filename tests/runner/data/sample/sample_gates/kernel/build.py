"""A sample gate module: importing it would need a GPU stack this test never installs."""

import gpu_stack_that_is_not_installed  # noqa: F401 - preflight must not import this module


def run(**args):
    return {}
