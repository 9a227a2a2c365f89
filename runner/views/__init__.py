"""Read-only views of a plan's runs and checkpoints: status, history, metric diffs, the HTML report
and its plots, JUnit and CI summaries.
"""
