"""DFlash block-diffusion drafting (being built)."""
