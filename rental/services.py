"""Writes for the rental domain: accounts now; leases join in the leases issue."""
from django.contrib.auth.models import User
from django.db import transaction

from inventory.services import audit_record


@transaction.atomic
def account_create(*, username: str, password: str, email: str = "") -> User:
    user = User.objects.create_user(username=username, password=password, email=email or "")
    audit_record(actor=user, action="account_create", obj=user)
    return user
