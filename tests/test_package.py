"""The distribution installs the user's folders under the raftline namespace only."""

import importlib


def test_every_folder_imports_under_the_raftline_namespace() -> None:
    for name in ("raftlog", "node", "api", "tiered", "clients", "chaos", "spark"):
        module = importlib.import_module(f"raftline.{name}")
        assert module.__doc__, f"raftline.{name} has no header"


def test_every_subpackage_is_listed_for_the_wheel() -> None:
    """An editable install imports any folder; a wheel (the Docker image) only listed ones."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for name, folder in config["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(root / folder).parts
            assert ".".join((name, *parts)) in listed, f"{init.parent} is not in packages"
