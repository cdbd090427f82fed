"""``python -m maxdecl`` is the ``maxdecl`` command."""

from .cli import main

raise SystemExit(main())
