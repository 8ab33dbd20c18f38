"""Builders most test packages share: the customer's SSH keys, an order placed through the
checkout service, the order form's data, a customer with a balance. Plain functions, no
fixtures (those live in a conftest.py); a test module imports them from here, never from
another test module."""
from django.urls import reverse
from django.utils import timezone

from billing.services import balance_top_up, checkout_place_order
from inventory.models import Offer, Site
from rental.models import CustomerSettings, Image
from rental.services import account_create

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
KEY = ED25519  # the name the lifecycle and payment tests use
RSA_1024 = ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCs1iItVMMkozv8h0hXHAj1f4bMSlqWGrW8aR9KdoVYT4aLyj2AinTDtzQ9V0Q0PWNkS"
            "nR85JqNDk7omlrz8O/T/Li44KklZPxiGC4Ydsw7N4ylKMoHdtxZSReL2fsxnZsCE6/xDxXkyL+tITndnau64Fs2g+XQ9E7pSbKlddByMQ==")


def order(customer, t0, *, offer="rtx-3090", term="week", pay=True, addons=None):
    """A lease and its invoice through the checkout service, at DFW-1 with the PyTorch image."""
    offer = Offer.objects.get(slug=offer)
    site = Site.objects.get(code="DFW-1")
    return checkout_place_order(customer=customer, offer=offer, site=site, term=term,
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                addons=addons or {}, pay_from_balance=pay, now=t0)


def order_url(slug="rtx-3090"):
    return reverse("order", args=[slug])


def form_data(**overrides):
    """The order form's fields for a week at DFW-1; `overrides` replace or add fields."""
    data = {"site": "DFW-1", "term": "week", "extra_nvme_tb": "0", "network_volume_tb": "0",
            "image": "pytorch-2.5-cuda-12.4", "ssh_public_key": ED25519}
    data.update(overrides)
    return data


def place(customer, slug="rtx-3090", pay=False):
    """A week of `slug` at DFW-1 with the first image of its vendor (the order page's default)."""
    offer = Offer.objects.get(slug=slug)
    image = Image.objects.filter(vendor=offer.gpu_model.vendor).first()
    return checkout_place_order(customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
                                image=image, ssh_public_key=ED25519, pay_from_balance=pay)


def new_customer(name, *, balance=0, auto_renew=True, now=None):
    """A customer account made through the sign-up service, with `balance` cents topped up."""
    user = account_create(username=name, password="correct horse battery 9")
    if balance:
        balance_top_up(customer=user, amount_cents=balance, now=now or timezone.now())
    if not auto_renew:
        CustomerSettings.objects.filter(user=user).update(auto_renew=False)
    return user
