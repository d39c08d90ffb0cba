"""vkdflash: cross-vendor speculative decoding on Vulkan.

The plugin API lives in `vkdflash.api`; its names are also attributes of this package
(`vkdflash.hookimpl`, `vkdflash.Strategy`, ...), imported on first use so that `import vkdflash`
stays cheap."""
import importlib
import importlib.util

__version__ = "0.1.0"


def __getattr__(name: str):
    # a submodule (`from . import plugins` while it is not loaded yet) is the import system's to find
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is None:
        api = importlib.import_module(f"{__name__}.api")
        if name in api.__all__:
            return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + importlib.import_module(f"{__name__}.api").__all__)
