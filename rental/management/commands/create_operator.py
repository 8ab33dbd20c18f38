import secrets

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from inventory.audit import audit_record


class Command(BaseCommand):
    help = ("Create the operator (superuser) account once; prints its password on first start only. "
            "--reset-password sets and prints a new password for an existing operator (audited).")

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")
        parser.add_argument("--reset-password", action="store_true",
                            help="Give the operator a new random password and print it (a lost first password).")

    def handle(self, *args, username, reset_password, **options):
        if reset_password:
            return self._reset(username)
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("Operator account exists (password shown on first start only; "
                              "`manage.py create_operator --reset-password` sets a new one).")
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

    def _reset(self, username: str) -> None:
        user = User.objects.filter(username=username, is_staff=True).first()
        if user is None:
            raise CommandError(f"No staff account named {username!r}.")
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save(update_fields=["password"])
        audit_record(actor=None, action="operator_password_reset", obj=user, detail={"by": "manage.py"})
        self.stdout.write(self.style.SUCCESS(f"New password for {username}: {password}  (shown only now)"))
