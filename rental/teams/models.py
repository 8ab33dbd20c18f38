"""Memberships and invitations (rental's tables: app label and migrations are rental's,
loaded by RentalConfig.import_models)."""
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class Role(models.TextChoices):
    OWNER = "owner", _("owner")
    BILLING = "billing", _("billing")
    DEVELOPER = "developer", _("developer")
    READ_ONLY = "read_only", _("read-only")


class Membership(models.Model):
    """`member` acts for `account` (the holder's user) in `role`. The holder needs no row:
    every user is the owner of their own account, always (rental.teams.rights)."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_members")
    member = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    role = models.CharField(max_length=10, choices=Role.choices)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        app_label = "rental"
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["account", "member"], name="membership_once"),
            models.CheckConstraint(condition=~Q(account=models.F("member")), name="membership_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.member_id} in {self.account_id} ({self.role})"


class Invitation(models.Model):
    """A single-use link (only its SHA-256 is stored) that makes whoever opens it while
    logged in a member of `account` in `role`, until `expires_at`."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "rental"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.account_id} ({self.role})"

    def pending(self, now) -> bool:
        return self.accepted_at is None and self.revoked_at is None and self.expires_at > now
