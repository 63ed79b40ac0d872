"""ordermq's version: the one place it is written (pyproject.toml reads it from here).

A literal, not importlib.metadata: reading the installed metadata costs every process that
imports `sdk` (each broker, worker and `ordermq` command) tens of milliseconds at start.
"""

__version__ = "0.1.0"
