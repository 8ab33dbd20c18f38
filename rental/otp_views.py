"""Two-factor sign-in for operators (django-otp TOTP).

/accounts/otp/setup/ — a staff member enrols an authenticator app: a fresh, unconfirmed
device is shown as a QR code (segno, inline SVG: no image request, nothing leaves the
server) and its base32 secret; entering a current code confirms it. From then on the
admin asks for a code after the password (rental.middleware.AdminOTPRequiredMiddleware).
/accounts/otp/verify/ — enter the code; wrong codes are throttled by django-otp.
"""
import base64

import segno
from django import forms
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db import transaction
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods
from django_otp import devices_for_user
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

PENDING = "pending (unconfirmed)"


class CodeForm(forms.Form):
    code = forms.RegexField(label=gettext_lazy("6-digit code"), regex=r"^\s*\d{6}\s*$", max_length=12,
                            widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}))


def _pending_device(user) -> TOTPDevice:
    device = TOTPDevice.objects.filter(user=user, confirmed=False, name=PENDING).first()
    return device or TOTPDevice.objects.create(user=user, name=PENDING, confirmed=False)


def _safe_next(request, default: str) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return target
    return default


@staff_member_required
@require_http_methods(["GET", "POST"])
def otp_setup(request):
    confirmed = list(devices_for_user(request.user, confirmed=True))
    if confirmed and not request.user.is_verified():
        # A password alone must not be enough to add a second device.
        return redirect(reverse("otp_verify") + "?next=" + reverse("otp_setup"))
    device = _pending_device(request.user)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if device.verify_token(form.cleaned_data["code"].strip()):
            with transaction.atomic():
                TOTPDevice.objects.filter(pk=device.pk).update(confirmed=True, name="authenticator")
                device.refresh_from_db()
            otp_login(request, device)
            messages.success(request, _("Two-factor sign-in is on: the admin will ask for a code."))
            return redirect("admin:index")
        form.add_error("code", _("That code is not right (or too old); try the current one."))
    qr = segno.make(device.config_url, error="m").svg_inline(scale=5, dark="#111", light="#fff")
    secret = base64.b32encode(device.bin_key).decode()
    return render(request, "rental/otp_setup.html",
                  {"form": form, "qr_svg": qr, "secret": secret, "confirmed": confirmed},
                  status=400 if form.errors else 200)


@require_http_methods(["GET", "POST"])
def otp_verify(request):
    if not request.user.is_authenticated:
        return redirect(reverse("admin:login") + "?next=" + reverse("admin:index"))
    next_url = _safe_next(request, reverse("admin:index"))
    if request.user.is_verified():
        return redirect(next_url)
    form = CodeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        code = form.cleaned_data["code"].strip()
        for device in devices_for_user(request.user, confirmed=True):
            if device.verify_token(code):
                otp_login(request, device)
                return redirect(next_url)
        form.add_error("code", _("That code is not right; wait for the next one and try again."))
    return render(request, "rental/otp_verify.html", {"form": form, "next": next_url},
                  status=400 if form.errors else 200)
