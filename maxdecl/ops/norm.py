"""(being written) ops of the norm family."""

__all__: list[str] = []
