"""SLA claims in the JSON API: the claim page's form (billing.sla.views.SlaClaimForm, the
same service and messages) and the customer's claims."""
from django.http import JsonResponse
from django.utils import timezone

from rental.api import ApiError, api_endpoint, field_errors, iso, json_body, usd

from ..models import SlaClaim
from .services import ClaimRefused, sla_claim_file
from .views import SlaClaimForm


def claim_json(claim: SlaClaim) -> dict:
    return {"id": claim.pk, "lease": claim.lease_id, "period": f"{claim.period:%Y-%m}", "state": claim.state,
            "message": claim.message, "created_at": iso(claim.created_at),
            "availability_pct": str(claim.availability_pct), "downtime_seconds": claim.downtime_seconds,
            "credit_cents": claim.credit_cents, "credit_usd": usd(claim.credit_cents),
            "decided_at": iso(claim.decided_at), "decision_reason": claim.decision_reason}


@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "order"}, right={"GET": "view", "POST": "order"})
def sla_claims(request):
    """GET: your claims. POST {"lease", "period": "YYYY-MM", "message"}: file one; the
    credit is computed now and an operator decides."""
    if request.method == "GET":
        rows = SlaClaim.objects.filter(customer=request.api_user)[:200]
        return JsonResponse({"claims": [claim_json(c) for c in rows]})
    data = json_body(request)
    now = timezone.now()
    form = SlaClaimForm({"lease": data.get("lease"), "period": data.get("period"), "message": data.get("message", "")},
                        customer=request.api_user, now=now)
    if not form.is_valid():
        raise field_errors({name: [str(m) for m in messages] for name, messages in form.errors.items()})
    year, month = (int(x) for x in form.cleaned_data["period"].split("-"))
    try:
        claim = sla_claim_file(customer=request.api_user, lease=form.cleaned_data["lease"],
                               period=timezone.datetime(year, month, 1).date(),
                               message=form.cleaned_data["message"], now=now)
    except ClaimRefused as exc:
        raise ApiError(409, "claim_refused", str(exc)) from exc
    return JsonResponse(claim_json(claim), status=201)
