"""The one exception user input may raise (the API answers it with a 400)."""


class SizingInputError(ValueError):
    """Bad user input; ``field`` is the parameter name, ``message`` the human reason."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
