import secrets

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand

from inventory.services import audit_record


class Command(BaseCommand):
    help = "Create the operator (superuser) account once; prints its password on first start only."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")

    def handle(self, *args, username, **options):
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("Operator account exists (password shown on first start only).")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username=username, password=password, email="")
        audit_record(actor=None, action="operator_create", obj=user)
        self.stdout.write(self.style.SUCCESS(
            f"Operator account created — username: {username}  password: {password}\n"
            "Log in at /admin/. This password is shown only now.\n"
            "Two-factor sign-in is required: at first login you must enrol an authenticator app "
            "(TOTP) before anything else, and save the recovery codes shown then."
        ))
