"""Account and customer pages: signup, my leases with their timeline and status, account
settings, API tokens and notifications. Invoices, refunds and ordering are billing's
(billing/views.py); rental pages show invoices through billing's template tags, because
rental never imports billing."""
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from .account_page import settings_context
from .accounts.recovery import account_recovery_codes_issue, keep_recovery_codes_to_show
from .accounts.services import (
    SshKeyRefused,
    TokenLimit,
    account_create,
    api_token_create,
    api_token_revoke,
    customer_settings,
    customer_settings_update,
    notification_mark_read,
    ssh_key_add,
    ssh_key_delete,
)
from .accounts.throttle import throttle_give_back, throttle_take, throttled
from .forms import ApiTokenForm, SettingsForm, SignupForm, SshKeyForm
from .i18n import remember_language
from .lease_page import lease_page_context
from .models import ApiToken, Lease, LeaseEvent
from .services import lease_auto_renew_set, lease_auto_renews
from .shown_once import keep_to_show_once, take_to_show
from .teams.rights import TEAM, customer_view, may
from .timeline import incident_milestones, layout, lease_milestones


def _safe_next(request) -> str:
    """Where to go after signing up: the page that asked for an account, if it is ours."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return target
    return reverse("home")


@require_http_methods(["GET", "POST"])
def _signup_refused(request):
    messages.error(request, _("Too many new accounts from your address; try again later."))
    return render(request, "registration/signup.html", {"form": SignupForm()}, status=429)


def signup(request):
    if request.user.is_authenticated:
        return redirect(_safe_next(request))
    form = SignupForm(request.POST or None)
    window = settings.SIGNUP_WINDOW_MINUTES * 60
    # Every post counts (so "that username exists" cannot be asked without end), and an
    # account is reserved against the address's limit before it is made
    # (concurrent sign-ups cannot all pass a check made before any of them counted).
    if request.method == "POST" and (
            not throttle_take("signup-attempt", request, limit=settings.SIGNUP_ATTEMPTS_PER_IP, window_seconds=window)
            or throttled("signup", request, limit=settings.SIGNUPS_PER_IP)):
        return _signup_refused(request)
    if request.method == "POST" and form.is_valid():
        if not throttle_take("signup", request, limit=settings.SIGNUPS_PER_IP, window_seconds=window):
            return _signup_refused(request)
        try:
            user = account_create(
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password1"],
                email=form.cleaned_data.get("email", ""),
            )
        except Exception:
            throttle_give_back("signup", request)
            raise
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        remember_language(user, request.LANGUAGE_CODE)  # notices in the language they signed up in
        # The recovery codes first (shown once, after a redirect: a reload re-sends no form),
        # then on to the page that asked for an account.
        return keep_recovery_codes_to_show(request, account_recovery_codes_issue(user=user), first=True,
                                           next_url=_safe_next(request))
    context = {"form": form, "next": _safe_next(request)}
    return render(request, "registration/signup.html", context, status=400 if form.errors else 200)


def healthz(request):
    """Liveness + database check for load balancers and docker-compose."""
    from django.db import connection
    from django.http import HttpResponse

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # noqa: BLE001 — any database failure means "not ready"
        return HttpResponse("database unavailable", status=503, content_type="text/plain")
    return HttpResponse("ok", content_type="text/plain")


# --- customer pages -------------------------------------------------------------------------
# Leases, their timeline and status, account settings, API tokens, notifications. Invoices
# and refunds on these pages come from billing's template tags (rental never imports billing).

def _optional_url(name: str) -> str:
    try:
        return reverse(name)
    except NoReverseMatch:
        return ""


def _customer_leases(user):
    return Lease.objects.filter(customer=user).select_related("offer__gpu_model", "site", "image")


@customer_view("view")
@login_required
@require_GET
def lease_list(request):
    now = timezone.now()
    rows = [(lease, layout(lease_milestones(lease, now), now)["upcoming"][:3])
            for lease in _customer_leases(request.account)]
    context = {"rows": rows, "sizing_url": _optional_url("sizing"), "now": now}
    return render(request, "rental/leases.html", context)


@customer_view("view")
@login_required
@require_GET
def lease_detail(request, lease_id: int):
    # Its events once, for the list and every part that looks at them (rental.lease_page).
    lease = get_object_or_404(_customer_leases(request.account).select_related("disk_key", "customer")
                              .prefetch_related(Prefetch("events", LeaseEvent.objects.select_related("actor"))),
                              pk=lease_id)
    now = timezone.now()
    page = lease_page_context(lease, now)
    milestones = lease_milestones(lease, now) + incident_milestones(page["downtimes"])
    account_auto_renew = customer_settings(request.account).auto_renew     # read once for both
    context = {"lease": lease, "now": now, **page,
               "timeline": layout(milestones, now), "events": lease.events.all(),
               "auto_renews": lease_auto_renews(lease, account_default=account_auto_renew),
               "account_auto_renew": account_auto_renew}
    # htmx polls the live region (the whole page but its heading) while something is in progress.
    return render(request, "rental/_lease_live.html" if request.htmx else "rental/lease_detail.html", context)


# Saving edits the account's notice address and renewal default: its owners' (a member
# changes their own address in their own account).
@customer_view({"GET": "view", "POST": "team"})
@login_required
@require_http_methods(["GET", "POST"])
def account_settings(request):
    if request.method == "GET":
        return render(request, "rental/settings.html", settings_context(request, **_new_token_to_show(request)))
    form = SettingsForm(request.POST)
    if not form.is_valid():
        return render(request, "rental/settings.html", settings_context(request, form=form), status=400)
    customer_settings_update(user=request.account, email=form.cleaned_data["email"],
                             auto_renew=form.cleaned_data["auto_renew"],
                             idle_notices=form.cleaned_data["idle_notices"])
    messages.success(request, _("Settings saved."))
    return redirect("account_settings")


@customer_view("tokens")
@never_cache
@login_required
@require_POST
def token_create(request):
    form = ApiTokenForm(request.POST)
    if not form.is_valid():
        return render(request, "rental/settings.html", settings_context(request, token_form=form), status=400)
    try:
        token, raw = api_token_create(customer=request.account, member=request.user, name=form.cleaned_data["name"],
                                      scopes=form.cleaned_data["scopes"])
    except TokenLimit:
        form.add_error(None, _("You have too many tokens; revoke one first."))
        return render(request, "rental/settings.html", settings_context(request, token_form=form), status=400)
    # Shown once, on the settings page this redirects to (a reload there re-sends nothing and
    # shows it no more); never in a message or a log.
    keep_to_show_once(request, NEW_TOKEN, {"raw": raw, "token_id": token.pk})
    return redirect(reverse("account_settings") + "#tokens")


NEW_TOKEN = "api-token"


def _new_token_to_show(request) -> dict:
    kept = take_to_show(request, NEW_TOKEN)
    if kept is None:
        return {}
    row = ApiToken.objects.filter(customer=request.account, pk=kept["token_id"]).first()
    return {"new_token": kept["raw"], "new_token_row": row} if row else {}


@customer_view("operate")
@login_required
@require_POST
def ssh_key_create(request):
    form = SshKeyForm(request.POST)
    if form.is_valid():
        try:
            key = ssh_key_add(customer=request.account, name=form.cleaned_data["name"],
                              public_key=form.cleaned_data["public_key"])
        except SshKeyRefused as exc:
            form.add_error("public_key", str(exc))
        else:
            messages.success(request, _("SSH key “%(name)s” saved.") % {"name": key.name})
            return redirect(reverse("account_settings") + "#ssh-keys")
    return render(request, "rental/settings.html", settings_context(request, ssh_key_form=form), status=400)


@customer_view("operate")
@login_required
@require_POST
def ssh_key_remove(request, key_id: int):
    if not ssh_key_delete(customer=request.account, key_id=key_id):
        raise Http404
    messages.success(request, _("SSH key deleted. Running leases keep the key they were ordered with."))
    return redirect(reverse("account_settings") + "#ssh-keys")


@customer_view("tokens")
@login_required
@require_POST
def token_revoke(request, token_id: int):
    # A member revokes their own tokens; the owners anyone's in the account.
    member = None if may(request, TEAM) else request.user
    if not api_token_revoke(customer=request.account, token_id=token_id, member=member):
        raise Http404
    messages.success(request, _("Token revoked."))
    return redirect("account_settings")


@customer_view("view")
@login_required
@require_POST
def notification_read(request, notification_id: int | None = None):
    notification_mark_read(customer=request.account, notification_id=notification_id)
    return redirect(reverse("account_settings") + "#notifications")


AUTO_RENEW_CHOICES = {"on": True, "off": False, "default": None}


@customer_view("order")
@login_required
@require_POST
def lease_auto_renew(request, lease_id: int):
    """The lease page's auto-renew choice (on, off, or the account's default)."""
    if not Lease.objects.filter(pk=lease_id, customer=request.account).exists():
        raise Http404  # another account's lease: not found, whatever was posted
    choice = request.POST.get("auto_renew", "")
    if choice not in AUTO_RENEW_CHOICES:
        messages.error(request, _("Choose on, off or the account's default."))
    elif not lease_auto_renew_set(customer=request.account, lease_id=lease_id, auto_renew=AUTO_RENEW_CHOICES[choice]):
        raise Http404
    else:
        messages.success(request, _("Auto-renew saved for this lease."))
    return redirect("lease_detail", lease_id=lease_id)
