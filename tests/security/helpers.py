"""Helpers of the security tests: the repository root and the environment only tests set,
staff permissions granted, an order of a given offer."""
from pathlib import Path

from django.contrib.auth.models import Permission

from billing.services import checkout_place_order
from inventory.models import Node, Offer, Site
from inventory.selectors import sites_with_stock_for
from rental.models import Image
from tests.factories import ED25519

ROOT = Path(__file__).resolve().parents[2]


# The test process's own variables, never production's (tests/e2e/conftest.py sets the last).
TEST_ONLY_ENV = {"TESTING", "DEBUG", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE"}


def grant(user, *codenames):
    for codename in codenames:
        app, name = codename.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=name))
    return type(user).objects.get(pk=user.pk)  # a fresh object: permissions are cached per instance


def order(customer, slug="mi300x", *, address=None, pay=False):
    offer = Offer.objects.get(slug=slug)
    stock = sites_with_stock_for(offer)
    site = Site.objects.get(code=sorted(stock)[0]) if stock else Node.objects.filter(gpu_model=offer.gpu_model).first().site
    return checkout_place_order(customer=customer, offer=offer, site=site, term="week",
                                image=Image.objects.filter(vendor=offer.gpu_model.vendor).first(),
                                ssh_public_key=ED25519, client_address=address, pay_from_balance=pay)
