"""Build of the C twins of the record loops (raftlog/_speedups.c); everything else is in
pyproject.toml. Optional: without a compiler raftlog/records.py runs its Python loops."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("raftline.raftlog._speedups", ["raftlog/_speedups.c"], optional=True),
    ]
)
