"""What the account settings page shows (/account/settings/): the settings, token and SSH
key forms, the customer's keys, tokens and notices, two-factor and recovery-code status.
Reads only. Here, below rental.views and rental.notifications.views, because both render
the page (the webhooks' views imported rental.views for it, in a circle)."""
from .accounts.services import customer_settings
from .accounts.two_factor import is_enrolled
from .forms import ApiTokenForm, SettingsForm, SshKeyForm
from .models import ApiToken, Notification, RecoveryCode, SshKey
from .teams.rights import TEAM, acting_for


def settings_context(request, **extra) -> dict:
    """The settings page's context; `extra` overrides a part (a bound form with its errors,
    a token or webhook secret shown once)."""
    acting = acting_for(request)   # teams: the account's things; two-factor and recovery are the member's own
    account = acting.account
    prefs = customer_settings(account)
    tokens = ApiToken.objects.filter(customer=account).select_related("member")
    if not acting.may(TEAM):       # a member sees (and revokes) the tokens they made
        tokens = tokens.filter(member=request.user)
    return {
        "acting": acting,
        "form": SettingsForm(initial={"email": account.email, "auto_renew": prefs.auto_renew,
                                     "idle_notices": prefs.idle_notices}),
        "token_form": ApiTokenForm(),
        "ssh_key_form": SshKeyForm(),
        "ssh_keys": SshKey.objects.filter(customer=account),
        "tokens": tokens.order_by("revoked_at", "-created_at", "-pk"),
        "notifications": Notification.objects.filter(customer=account).select_related("lease")[:50],
        "two_factor_on": is_enrolled(request.user),
        "recovery_codes_left": RecoveryCode.objects.filter(user=request.user, used_at__isnull=True).count(),
        **extra,
    }
