"""One exception type for every user-facing failure: the CLI prints it as one line."""


class VkdflashError(Exception):
    """A problem the user can act on; its message is a complete one-line explanation."""


QUOTE_LIMIT = 80  # characters of file- or user-supplied text an error message may echo


def quote(text, limit: int = QUOTE_LIMIT) -> str:
    """repr() of `text` cut to about `limit` characters, saying how long it was."""
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"
