"""A changed password revokes the account's API tokens: whoever knew the old
password may have made a token with it. A pre_save hook catches every way a password
changes (the password change page, a reset by e-mail or recovery code, the admin,
`changepassword`), not just the views we wrote."""
from django.contrib.auth import get_user_model
from django.db.models.signals import pre_save
from django.dispatch import receiver


@receiver(pre_save, sender=get_user_model(), dispatch_uid="rental.revoke_tokens_on_password_change")
def revoke_tokens_on_password_change(sender, instance, update_fields=None, raw=False, **kwargs):
    # set_password() leaves the new raw password in _password until the save; a hash
    # upgrade at login (check_password's setter) clears it first, so it revokes nothing.
    if raw or instance.pk is None or getattr(instance, "_password", None) is None:
        return
    if update_fields is not None and "password" not in update_fields:
        return
    from .accounts.services import api_tokens_revoke_all

    api_tokens_revoke_all(customer=instance, reason="password changed")
