"""segscope's version: one place, read by pyproject.toml and every program's --version."""

__version__ = "0.14.0"
