"""The distribution installs the user's folders under the raftline namespace only."""

import importlib


def test_every_folder_imports_under_the_raftline_namespace() -> None:
    for name in ("raftlog", "node", "api", "tiered", "clients", "chaos", "spark"):
        module = importlib.import_module(f"raftline.{name}")
        assert module.__doc__, f"raftline.{name} has no header"
