"""What every request an op cannot take becomes: an unknown op, a bad shape, dtype or file."""


class OpError(ValueError):
    """An unknown op, or a problem that the op cannot take (bad shape, dtype, file)."""
