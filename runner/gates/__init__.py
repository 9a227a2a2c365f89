"""Gates: the protocol a gate process speaks, running one in its own process group, reading what it
left, judging it, and the child process of a ``call:`` gate. Standard library only at import, so
``runner.gatekit`` (which imports ``runner.protocol``) stays light.
"""
