"""Plain helpers of the browser tests: the customer's SSH key, a signed-up customer, the check
that a page does not scroll sideways. Fixtures (browser, shop) are in conftest.py."""
from tests.e2e.conftest import PASSWORD

# A valid ed25519 public key (the lifecycle tests' key).
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P carol@laptop"


def no_horizontal_overflow(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


def _customer(name):
    from rental.services import account_create

    return account_create(username=name, password=PASSWORD)
