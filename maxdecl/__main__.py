"""``python -m maxdecl`` is the ``maxdecl`` command."""

from .cli import console_main

console_main()
