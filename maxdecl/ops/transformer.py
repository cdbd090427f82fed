"""(being written) ops of the transformer family."""

__all__: list[str] = []
