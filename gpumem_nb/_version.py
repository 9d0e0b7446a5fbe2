"""The package's version: one line, read by the build (pyproject.toml) and by the package."""

__all__ = ["__version__"]

__version__ = "0.1.0"
