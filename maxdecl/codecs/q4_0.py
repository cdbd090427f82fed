"""q4_0 encoding (being written)."""
