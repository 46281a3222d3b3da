"""The package version, in a module of its own so that any wing can read it without
importing the package face (which loads the estimator and placement)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
