"""The installed ordermq's version, as the package metadata (pyproject.toml) gives it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ordermq")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
