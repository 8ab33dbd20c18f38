"""Exit codes: one per failure class, so scripts can tell what went wrong."""

OK = 0
FAILED = 1          # anything unexpected
USAGE = 2           # bad arguments (argparse), or a local choice that cannot be made
NOT_LOGGED_IN = 3   # no token stored, or the server refused it (401)
FORBIDDEN = 4       # the token lacks the scope (403)
NOT_FOUND = 5       # no such lease/invoice/key/offer, or not yours (404)
REFUSED = 6         # the server refused the action: sold out, refund window over, not running (409)
PAYMENT = 7         # the balance does not cover it (402)
INVALID = 8         # the server refused the input (400, 413)
UNREACHABLE = 9     # no connection, a timeout, a 5xx or an answer that is not the API's JSON
WAIT_TIMEOUT = 10   # --wait gave up before the instance was ready
LEASE_ENDED = 11    # while waiting, the lease was cancelled or failed
# `gpu-rent cp`'s own failures (verify-record has 20 and 21): the SSH side of a lease.
SSH_FAILED = 30     # no SSH connection to the instance, or it broke during a copy (run again: it resumes)
SSH_AUTH = 31       # the instance refused the SSH key
HOST_KEY = 32       # the instance's host key is not the one kept from the first connection
NO_SPACE = 33       # the destination's disk is full (what was copied is kept: free space, run again)

EXIT_CODES = {
    OK: "success",
    FAILED: "unexpected error",
    USAGE: "bad arguments",
    NOT_LOGGED_IN: "not logged in, or the token was refused",
    FORBIDDEN: "the token lacks the scope for this",
    NOT_FOUND: "not found (or not yours)",
    REFUSED: "refused by the server (sold out, not allowed now)",
    PAYMENT: "the balance does not cover it",
    INVALID: "the server refused the input",
    UNREACHABLE: "server unreachable or not answering as the API",
    WAIT_TIMEOUT: "timed out waiting for the instance",
    LEASE_ENDED: "the lease was cancelled or failed while waiting",
    SSH_FAILED: "cp: no SSH connection to the instance, or it broke (run again to resume)",
    SSH_AUTH: "cp: the instance refused the SSH key",
    HOST_KEY: "cp: the instance's host key changed since the first connection",
    NO_SPACE: "cp: no space left on the destination disk",
}

BY_STATUS = {400: INVALID, 401: NOT_LOGGED_IN, 402: PAYMENT, 403: FORBIDDEN, 404: NOT_FOUND, 405: FAILED,
             409: REFUSED, 413: INVALID}


class CliError(Exception):
    """A failure with its exit code, the API's error code (if any) and a message."""

    def __init__(self, code: int, message: str, *, error: str = "", detail: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.error, self.detail = code, message, error, detail or {}

    def as_json(self) -> dict:
        return {"error": self.error or EXIT_CODES.get(self.code, "error"), "message": self.message,
                "exit_code": self.code, **({"detail": self.detail} if self.detail else {})}


def epilog() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:>2}  {text}" for code, text in EXIT_CODES.items())
