"""bf16 encoding (being written)."""
