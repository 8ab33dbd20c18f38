"""Account recovery without e-mail: ten one-time recovery codes are shown once
at sign-up (and again, new ones, from the settings page with the password); with one of
them, "forgot password" sets a new password. Only SHA-256 hashes are stored (the codes are
80 random bits, like API tokens). Customers with an e-mail address can also use Django's
password reset by e-mail (storefront/urls.py). Every write is audited; attempts are throttled
per client address (rental.accounts.throttle)."""
import base64
import hashlib
import secrets
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import password_validation
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db import transaction
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from inventory.audit import audit_record

from ..models import RecoveryCode
from ..shown_once import keep_to_show_once, take_to_show
from .login_limits import remember_device
from .throttle import per_user, throttle_hit, throttle_posts, throttled
from .two_factor import display_code, normalize_code

CODE_COUNT = 10


def code_hash(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode()).hexdigest()


# --- services ---------------------------------------------------------------------------------

@transaction.atomic
def account_recovery_codes_issue(*, user: User) -> list[str]:
    """New codes replacing all earlier ones; returned for showing once, never stored."""
    RecoveryCode.objects.filter(user=user).delete()
    codes = [base64.b32encode(secrets.token_bytes(10)).decode().lower() for _ in range(CODE_COUNT)]
    now = timezone.now()
    RecoveryCode.objects.bulk_create([RecoveryCode(user=user, code_hash=code_hash(c), created_at=now) for c in codes])
    audit_record(actor=user, action="account_recovery_codes_issue", obj=user, detail={"count": len(codes)})
    return [display_code(c) for c in codes]


@transaction.atomic
def account_recover(*, username: str, code: str, new_password: str) -> User | None:
    """Spends one unused code of `username` and sets the new password (which also revokes
    the account's API tokens). None when the pair does not match."""
    row = (RecoveryCode.objects.select_for_update().select_related("user")
           .filter(user__username=username, user__is_active=True, code_hash=code_hash(code), used_at__isnull=True)
           .first())
    if row is None:
        return None
    RecoveryCode.objects.filter(pk=row.pk).update(used_at=timezone.now())
    user = row.user
    user.set_password(new_password)
    user.save(update_fields=["password"])
    left = RecoveryCode.objects.filter(user=user, used_at__isnull=True).count()
    audit_record(actor=user, action="account_recover", obj=user, detail={"codes_left": left})
    return user


# --- pages ------------------------------------------------------------------------------------

RECOVERY_CODES = "recovery-codes"


def keep_recovery_codes_to_show(request, codes: list[str], *, first: bool, next_url: str = ""):
    """Redirects to the page that shows the codes once (POST-redirect-GET): a
    reload there neither re-sends the form nor shows them again."""
    keep_to_show_once(request, RECOVERY_CODES, {"codes": codes, "first": first})
    query = f"?{urlencode({'next': next_url})}" if next_url else ""
    return redirect(reverse("recovery_codes_show") + query)


@login_required
@require_GET
def recovery_codes_show(request):
    kept = take_to_show(request, RECOVERY_CODES) or {}
    next_url = request.GET.get("next", "")
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        next_url = ""
    context = {"codes": kept.get("codes"), "first": kept.get("first", False), "next_url": next_url}
    response = render(request, "registration/recovery_codes.html", context)
    response["Cache-Control"] = "no-store"
    return response


class ForgotPasswordForm(forms.Form):
    username = forms.CharField(label=gettext_lazy("Username"), max_length=150)
    code = forms.CharField(label=gettext_lazy("Recovery code"), max_length=40,
                           widget=forms.TextInput(attrs={"autocomplete": "off"}))
    new_password1 = forms.CharField(label=gettext_lazy("New password"), strip=False,
                                    widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))
    new_password2 = forms.CharField(label=gettext_lazy("New password again"), strip=False,
                                    widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))

    def clean(self):
        data = super().clean()
        one, two = data.get("new_password1"), data.get("new_password2")
        if one and two and one != two:
            self.add_error("new_password2", _("The two passwords differ."))
        elif one:
            user = User(username=data.get("username", ""))
            try:
                password_validation.validate_password(one, user)
            except forms.ValidationError as exc:
                self.add_error("new_password1", exc)
        return data


@never_cache
@require_http_methods(["GET", "POST"])
def forgot_password(request):
    form = ForgotPasswordForm(request.POST or None)
    if request.method == "POST":
        if throttled("recover", request, limit=settings.RECOVERY_ATTEMPTS_PER_IP):
            messages.error(request, _("Too many attempts from your address; try again later."))
            return render(request, "registration/forgot_password.html", {"form": ForgotPasswordForm()}, status=429)
        throttle_hit("recover", request, window_seconds=settings.RECOVERY_WINDOW_MINUTES * 60)
        if form.is_valid():
            user = account_recover(username=form.cleaned_data["username"], code=form.cleaned_data["code"],
                                   new_password=form.cleaned_data["new_password1"])
            if user is not None:
                messages.success(request, _("Your password is changed. Sign in with it; that recovery code is "
                                            "spent and your API tokens are revoked."))
                # A recovery code proves the account is theirs: this browser is then known,
                # so others' guesses at the username cannot keep them from signing in.
                response = redirect("login")
                remember_device(request, response, user)
                return response
            form.add_error(None, _("That username and recovery code do not match (or the code was used)."))
    return render(request, "registration/forgot_password.html", {"form": form}, status=400 if form.errors else 200)


class PasswordConfirmForm(forms.Form):
    password = forms.CharField(label=gettext_lazy("Your password"), strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
@throttle_posts("password-check", limit="PASSWORD_CHECKS_PER_USER", window_minutes="PASSWORD_CHECK_WINDOW_MINUTES",
                key=per_user)
def recovery_codes_regenerate(request):
    form = PasswordConfirmForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if request.user.check_password(form.cleaned_data["password"]):
            return keep_recovery_codes_to_show(request, account_recovery_codes_issue(user=request.user), first=False)
        form.add_error("password", _("That is not your password."))
    return render(request, "registration/recovery_codes_new.html",
                  {"form": form, "left": RecoveryCode.objects.filter(user=request.user, used_at__isnull=True).count(),
                   "settings_url": reverse("account_settings")}, status=400 if form.errors else 200)
