"""The repository: the one git layer, the checkpoint commit and its recovery, the lock, and the
tree fingerprint.
"""
