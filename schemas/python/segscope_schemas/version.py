"""segscope's version: one place, read by pyproject.toml and every program's --version."""

__version__ = "0.14.0"

# what every program's --version prints
VERSION_LINE = f"segscope {__version__}"
