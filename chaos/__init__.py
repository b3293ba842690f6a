"""Jepsen-style fault injection against a running cluster, and the history checkers.

Owns nemeses, workloads, history recording and anomaly checking.
"""
