"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UserError(Exception):
    """Bad input: unknown model or dataset, out-of-range option, missing file, mismatched plan."""
