"""Build of the C twins of the record loops (raftlog/_speedups.c) and of the columnar segment
decoder (raftlog/_columns.c); everything else is in pyproject.toml. Optional: without a compiler
raftlog/records.py and raftlog/columns.py run their Python loops."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "raftline.raftlog._speedups",
            ["raftlog/_speedups.c"],
            depends=["raftlog/_record_reader.h"],
            optional=True,
        ),
        # Segments straight into Arrow column buffers (raftlog/columns.py, the Spark reader).
        Extension(
            "raftline.raftlog._columns",
            ["raftlog/_columns.c"],
            depends=["raftlog/_record_reader.h"],
            optional=True,
        ),
    ]
)
