"""Tiered storage: sealed segments offloaded to S3-compatible object storage.

Owns uploads, the remote manifest and remote reads.
"""
