"""vkdflash: cross-vendor speculative decoding on Vulkan."""
__version__ = "0.1.0"
