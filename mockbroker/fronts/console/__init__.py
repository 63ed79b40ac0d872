"""The broker's console: pages for people, on `--console-port` (mockbroker/fronts/console).

A thin front like the others: every page reads and changes state through the AdminService
the `ordermq` command uses (admin_calls.py), rendered on the server (pages.py, Jinja2
templates in templates.py); no JavaScript, so a page is what the browser was sent.
"""

from mockbroker.fronts.console.server import ConsoleServer

__all__ = ["ConsoleServer"]
