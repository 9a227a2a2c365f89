"""What a run leaves: the machine it ran on, its results, its folder under ``reports/`` and the
places it may write.
"""
