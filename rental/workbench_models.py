"""What an account keeps for its leases' workbench (rental.workbench): registry credentials
and account-wide variables. Imported by rental/models.py."""
from django.conf import settings
from django.db import models

# --- the workbench: what an account keeps for its leases (rental.workbench) -----------------

class RegistryCredential(models.Model):
    """A login to a private container registry. The password is sealed at rest (core.sealing)
    and never shown again; it is unsealed only into the desired state of the node that runs a
    lease pulling from that registry."""

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 related_name="registry_credentials")
    name = models.CharField(max_length=60)
    server = models.CharField(max_length=255, help_text="e.g. ghcr.io, registry.example:5000")
    username = models.CharField(max_length=255)
    sealed_password = models.TextField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["customer", "name"], name="registry_credential_name_once")]

    def __str__(self) -> str:
        return f"{self.name} ({self.username}@{self.server})"


class AccountVariable(models.Model):
    """A variable or secret the account adds to every lease it orders (the lease's own value
    of the same name wins). A secret's value is sealed and never shown again."""

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 related_name="account_variables")
    name = models.CharField(max_length=128)
    secret = models.BooleanField(default=False)
    value = models.TextField(blank=True, help_text="A plain variable's value; empty for a secret")
    sealed_value = models.TextField(blank=True, help_text="A secret's value, sealed")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["customer", "name"], name="account_variable_name_once")]

    def __str__(self) -> str:
        return f"{self.name} ({'secret' if self.secret else 'variable'})"
