"""q5_0 encoding (being written)."""
