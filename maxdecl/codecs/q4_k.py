"""q4_k encoding (being written)."""
