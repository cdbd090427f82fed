"""(being written) ops of the custom family."""

__all__: list[str] = []
