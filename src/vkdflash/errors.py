"""One exception type for every user-facing failure: the CLI prints it as one line."""


class VkdflashError(Exception):
    """A problem the user can act on; its message is a complete one-line explanation."""
