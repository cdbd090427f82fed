"""(being written) ops of the quantized family."""

__all__: list[str] = []
