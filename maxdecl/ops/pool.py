"""(being written) ops of the pool family."""

__all__: list[str] = []
