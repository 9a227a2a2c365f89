"""The plan file: its schema and thresholds, loading it, rewriting its status bytes, the order
phases and gates run in, and scaffolding a new one.
"""
