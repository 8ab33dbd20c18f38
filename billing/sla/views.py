"""The customer's SLA claim page: file a claim for a lease and a month (a simple ticket),
see the computed credit and the operator's decision. Mounted by the root URLconf with
`path("billing/sla/", include("billing.sla.urls"))`."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods

from core.money import format_usd
from rental.models import Lease
from rental.teams.rights import customer_view

from ..models import SlaClaim
from .services import ClaimRefused, claimable_periods, month_bounds, sla_claim_file


class LeaseChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, lease):
        return _("Lease #%(id)s: %(offer)s (%(state)s)") % {"id": lease.pk, "offer": lease.offer.display_name,
                                                             "state": lease.get_state_display()}


class SlaClaimForm(forms.Form):
    lease = LeaseChoiceField(queryset=Lease.objects.none(), label=gettext_lazy("Lease"))
    period = forms.ChoiceField(label=gettext_lazy("Month (UTC)"))
    message = forms.CharField(label=gettext_lazy("What happened"), required=False, max_length=4000,
                              widget=forms.Textarea(attrs={"rows": 4}))

    def __init__(self, *args, customer, now, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["lease"].queryset = (Lease.objects.filter(customer=customer, started_at__isnull=False)
                                         .select_related("offer__gpu_model", "site"))
        self.fields["period"].choices = [(f"{p:%Y-%m}", date_format(p, "YEAR_MONTH_FORMAT"))
                                         for p in affected_periods(customer=customer, now=now)]


def affected_periods(*, customer, now) -> list:
    """The claimable months (ended, within the claim window) in which an incident affected
    one of the customer's leases: a month without one has nothing to claim."""
    from django.db.models import Q

    from inventory.models import Downtime

    leases = Lease.objects.filter(customer=customer).values("pk")
    found = []
    for period in claimable_periods(now=now):
        start, end = month_bounds(period)
        if Downtime.objects.filter(lease_id__in=leases, starts_at__lt=end).filter(
                Q(ends_at__isnull=True) | Q(ends_at__gt=start)).exists():
            found.append(period)
    return found


@customer_view({"GET": "view", "POST": "order"})
@login_required
@require_http_methods(["GET", "POST"])
def sla_claims(request):
    now = timezone.now()
    form = SlaClaimForm(request.POST or None, customer=request.account, now=now)
    if request.method == "POST" and form.is_valid():
        year, month = (int(x) for x in form.cleaned_data["period"].split("-"))
        try:
            claim = sla_claim_file(customer=request.account, lease=form.cleaned_data["lease"],
                                   period=timezone.datetime(year, month, 1).date(),
                                   message=form.cleaned_data["message"], now=now)
        except ClaimRefused as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Claim #%(id)s filed: computed credit %(credit)s (availability "
                                        "%(pct)s%%). An operator will decide.")
                             % {"id": claim.pk, "credit": format_usd(claim.credit_cents, always_cents=True),
                                "pct": claim.availability_pct})
            return redirect("sla:claims")
    claims = SlaClaim.objects.filter(customer=request.account).select_related("lease__offer__gpu_model")[:50]
    return render(request, "billing/sla_claim.html", {"form": form, "claims": claims})


def _pct(fraction) -> str:
    """99.9 for 999/1000, 95 for 95/100: the figure as people write it."""
    return f"{float(fraction * 100):g}"


@customer_view("public")
@require_GET
def sla_terms(request):
    """The public SLA, from the same target, bands and claim window that compute credits."""
    from .services import BANDS, CLAIM_WINDOW, SLA_TARGET

    bands = [{"below_pct": _pct(below), "multiplier": mult} for below, mult in reversed(BANDS)]
    context = {"target_pct": _pct(SLA_TARGET), "bands": bands, "claim_days": CLAIM_WINDOW.days}
    return render(request, "billing/sla_terms.html", context)
