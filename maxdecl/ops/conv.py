"""(being written) ops of the conv family."""

__all__: list[str] = []
