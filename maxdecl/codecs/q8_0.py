"""q8_0 encoding (being written)."""
