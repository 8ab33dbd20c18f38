"""Secrets shown once, after a redirect: a new API token, new recovery codes.

The POST that makes the secret keeps it in the session and redirects; the GET that follows
takes it out of the session as it renders it. Reloading that page then shows it no more
(and re-sends no form), while the first display cannot lose it: the secret leaves the
session only in the response that shows it. The session row holds it for that one round
trip (or, should the redirect never be followed, until the next display or sign-out)."""

PREFIX = "shown-once:"


def keep_to_show_once(request, what: str, value) -> None:
    request.session[PREFIX + what] = value


def take_to_show(request, what: str):
    """The kept value (gone from the session from now on), or None when it was shown."""
    return request.session.pop(PREFIX + what, None)
