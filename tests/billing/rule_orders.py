"""An order as the order and invoice rule tests place it (unpaid by default, with add-ons,
a restore or an address), and the week's price it is checked against."""
from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image
from tests.automation.helpers import KEY

PRICE = 6500  # rtx-3090, one week


def order(customer, t0, *, pay=False, addons=None, restore_from=None, address=None):
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                site=Site.objects.get(code="DFW-1"), term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                addons=addons, pay_from_balance=pay, now=t0, restore_from=restore_from,
                                client_address=address)
