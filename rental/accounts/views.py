"""Two-factor sign-in pages (django-otp TOTP + one-time recovery codes), for everyone:
mandatory for staff (storefront.middleware.TwoFactorMiddleware sends them here before anything
else), optional for customers (from the settings page).

/accounts/otp/setup/ — enrol an authenticator app: a fresh, unconfirmed device is shown as
a QR code (segno, inline SVG: nothing leaves the server) and its base32 secret; a current
code confirms it. Replacing an enrolled authenticator also needs a code from the current
one or a recovery code, so a stolen session alone cannot add the attacker's phone. Fresh
recovery codes are shown once, on the confirmation page.
/accounts/otp/verify/ — the code step after the password (authenticator or recovery code;
wrong codes are throttled by django-otp).
/accounts/otp/recovery-codes/ — new recovery codes (the old ones stop working), with a code.
/accounts/otp/disable/ — customers only, with a code.
"""
import base64

import segno
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from django_otp import login as otp_login

from .throttle import per_user, throttle_posts
from .two_factor import (
    is_enrolled,
    matching_device,
    pending_device,
    recovery_codes_issue,
    two_factor_disable,
    two_factor_enrol,
)

OTP_INPUT = {"autocomplete": "one-time-code", "inputmode": "numeric"}


class CodeForm(forms.Form):
    code = forms.RegexField(label=gettext_lazy("6-digit code"), regex=r"^\s*\d{6}\s*$", max_length=12,
                            widget=forms.TextInput(attrs=OTP_INPUT))


class CurrentCodeForm(forms.Form):
    """A code from the enrolled authenticator, or one recovery code."""
    current_code = forms.CharField(label=gettext_lazy("Code from your current authenticator, or a backup code"),
                                   max_length=40, widget=forms.TextInput(attrs={"autocomplete": "one-time-code"}))


class SetupForm(CodeForm):
    """Enrolling an authenticator also asks for the password: a stolen session
    alone cannot tie the account to the thief's phone."""
    password = forms.CharField(label=gettext_lazy("Your password"), strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))
    field_order = ["password", "code"]


class EnrolForm(SetupForm, CurrentCodeForm):
    field_order = ["password", "current_code", "code"]


class VerifyForm(forms.Form):
    code = forms.CharField(label=gettext_lazy("Code (or a backup code)"), max_length=40,
                           widget=forms.TextInput(attrs=OTP_INPUT))


def home_for(user) -> str:
    return reverse("admin:index") if user.is_staff else reverse("account_settings")


def _safe_next(request, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return target
    return default


def _show_recovery_codes(request, codes: list[str], *, first: bool):
    response = render(request, "rental/otp_recovery_codes.html",
                      {"codes": codes, "first": first, "continue_url": home_for(request.user)})
    response["Cache-Control"] = "no-store"
    return response


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
@throttle_posts("password-check", limit="PASSWORD_CHECKS_PER_USER", window_minutes="PASSWORD_CHECK_WINDOW_MINUTES",
                key=per_user)
def otp_setup(request):
    enrolled = is_enrolled(request.user)
    if enrolled and not request.user.is_verified():
        return redirect(reverse("otp_verify") + "?next=" + reverse("otp_setup"))
    device = pending_device(request.user)
    form = (EnrolForm if enrolled else SetupForm)(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if not request.user.check_password(form.cleaned_data["password"]):
            form.add_error("password", _("That is not your password."))
        elif enrolled and not matching_device(request.user, form.cleaned_data["current_code"]):
            form.add_error("current_code", _("That is not a current code or an unused backup code."))
        elif not device.verify_token(form.cleaned_data["code"].strip()):
            form.add_error("code", _("That code is not right (or too old); try the current one."))
        else:
            codes = two_factor_enrol(user=request.user, device=device)
            device.refresh_from_db()
            otp_login(request, device)
            return _show_recovery_codes(request, codes, first=True)
    qr = segno.make(device.config_url, error="m").svg_inline(scale=5, dark="#111", light="#fff")
    secret = base64.b32encode(device.bin_key).decode()
    return render(request, "rental/otp_setup.html",
                  {"form": form, "qr_svg": qr, "secret": secret, "enrolled": enrolled},
                  status=400 if form.errors else 200)


@never_cache
@require_http_methods(["GET", "POST"])
def otp_verify(request):
    if not request.user.is_authenticated:
        return redirect(reverse("login"))
    next_url = _safe_next(request, home_for(request.user))
    if request.user.is_verified():
        return HttpResponseRedirect(next_url)
    if not is_enrolled(request.user):
        return redirect("otp_setup")
    form = VerifyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        device = matching_device(request.user, form.cleaned_data["code"])
        if device is not None:
            otp_login(request, device)
            return HttpResponseRedirect(next_url)
        form.add_error("code", _("That code is not right; wait for the next one and try again."))
    return render(request, "rental/otp_verify.html", {"form": form, "next": next_url},
                  status=400 if form.errors else 200)


def _code_checked_page(request, *, template: str, on_success):
    """GET shows a form asking for a current code; a POST with a good one runs on_success."""
    if not is_enrolled(request.user):
        return redirect("otp_setup")
    form = CurrentCodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if matching_device(request.user, form.cleaned_data["current_code"]):
            return on_success()
        form.add_error("current_code", _("That is not a current code or an unused backup code."))
    return render(request, template, {"form": form}, status=400 if form.errors else 200)


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def otp_recovery_codes(request):
    def issue():
        return _show_recovery_codes(request, recovery_codes_issue(user=request.user), first=False)
    return _code_checked_page(request, template="rental/otp_recovery_codes_new.html", on_success=issue)


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def otp_disable(request):
    if request.user.is_staff:
        return HttpResponseForbidden(_("Two-factor sign-in is mandatory for staff."))

    def disable():
        two_factor_disable(user=request.user)
        messages.success(request, _("Two-factor sign-in is off."))
        return redirect(reverse("account_settings") + "#two-factor")
    return _code_checked_page(request, template="rental/otp_disable.html", on_success=disable)
