"""q6_k encoding (being written)."""
