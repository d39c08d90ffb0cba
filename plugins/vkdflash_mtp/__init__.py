"""MTP next-n head drafting (being built)."""
