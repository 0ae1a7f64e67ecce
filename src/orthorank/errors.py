"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UserError(Exception):
    """Bad input: unknown model or dataset, out-of-range option, missing file, mismatched plan."""


def number_list(text: str, option: str) -> list[float]:
    """'0.1, 0.2' -> [0.1, 0.2] for a comma-separated option; a one-line UserError naming `option` otherwise."""
    try:
        values = [float(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise UserError(f"{option} must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise UserError(f"{option} is empty")
    return values


def comma_items(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated list, in order, without repeats."""
    return list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
