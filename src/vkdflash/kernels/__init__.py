"""Kernel families: each module records its dispatches into a runtime Graph."""
