"""Exactly once over the API: a write sent with an `Idempotency-Key` header runs once per
account and key. The first request's successful answer is stored in the same transaction
as what the write did, so a retry with the same key and the same request gets that answer
again (marked `Idempotent-Replayed: true`) and places no second order, charge, snapshot or
delivery; the same key with a different request is refused (422 idempotency_key_reused).

Keys are scoped per account (every token of the account shares them) and forgotten after
API_IDEMPOTENCY_KEY_HOURS. Only a 2xx answer is kept: a refused request (4xx) created
nothing, so the key may be used again, e.g. with the input corrected; a server error keeps
nothing either. An answer that carries a secret shown once (a new S3 key) is not kept: its
replay is a 409 secret_shown_once. Two requests with one key at the same moment: the second waits on the
first's row (the unique constraint) and then replays its answer. ADR 0011."""
import hashlib
import json
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _

HEADER = "Idempotency-Key"
KEY_MAX_LENGTH = 255
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class IdempotentRequest(models.Model):
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 related_name="idempotent_requests")
    key = models.CharField(max_length=KEY_MAX_LENGTH)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the method, path and body")
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300)
    status = models.PositiveSmallIntegerField()
    body = models.BinaryField()
    content_type = models.CharField(max_length=100)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        app_label = "rental"
        constraints = [models.UniqueConstraint(fields=["customer", "key"], name="idempotency_key_once")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"


def key_ttl() -> timedelta:
    return timedelta(hours=settings.API_IDEMPOTENCY_KEY_HOURS)


def fingerprint(request) -> str:
    """The request as a retry repeats it: method, path, query and body. A JSON body counts
    by its content (key order and spacing do not matter)."""
    body = request.body
    try:
        body = json.dumps(json.loads(body.decode("utf-8") or "null"), sort_keys=True,
                          separators=(",", ":")).encode()
    except (UnicodeDecodeError, ValueError, RecursionError):
        pass
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.path.encode(), request.META.get("QUERY_STRING", "").encode(),
                 body):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


def _error(status: int, error: str, message: str) -> JsonResponse:
    return JsonResponse({"error": error, "message": message, "header": HEADER}, status=status)


def _replay(record: IdempotentRequest, request_fingerprint: str) -> HttpResponse:
    if record.fingerprint != request_fingerprint:
        return _error(422, "idempotency_key_reused", _(
            "This Idempotency-Key was already used for another request (%(method)s %(path)s, or another body); "
            "send a new key with a new request.") % {"method": record.method, "path": record.path})
    response = HttpResponse(bytes(record.body), status=record.status, content_type=record.content_type)
    response["Idempotent-Replayed"] = "true"
    return response


def run_once(request, customer, run) -> HttpResponse:
    """`run()` (the view) once per (customer, Idempotency-Key); without the header, just
    `run()`. The reservation, the view's writes and the stored answer commit together."""
    key = request.headers.get(HEADER)
    if key is None or request.method not in WRITE_METHODS:
        return run()
    if not 1 <= len(key) <= KEY_MAX_LENGTH or not key.isascii() or not key.isprintable():
        return _error(400, "bad_idempotency_key", _(
            "An Idempotency-Key is 1 to %(n)d printable ASCII characters, e.g. a UUID.") % {"n": KEY_MAX_LENGTH})
    mark = fingerprint(request)
    now = timezone.now()
    with transaction.atomic():
        # This account's expired keys go first (keeps the table to what is within the TTL).
        IdempotentRequest.objects.filter(customer=customer, expires_at__lte=now).delete()
        try:
            with transaction.atomic():
                record = IdempotentRequest.objects.create(
                    customer=customer, key=key, fingerprint=mark, method=request.method, path=request.path[:300],
                    status=0, body=b"", content_type="", created_at=now, expires_at=now + key_ttl())
        except IntegrityError:
            # Another request with this key committed first (PostgreSQL waited for it here).
            return _replay(IdempotentRequest.objects.get(customer=customer, key=key), mark)
        response = run()
        if 200 <= response.status_code < 300 and getattr(response, "shown_once", False):
            # A secret (a new S3 key) is never kept here: a replay says it was done.
            gone = _error(409, "secret_shown_once", _(
                "This request was done; the secret it made was shown once, in its first answer, and is not "
                "kept. Rotate the key for a new secret."))
            record.status, record.body, record.content_type = 409, gone.content, gone["Content-Type"]
            record.save(update_fields=["status", "body", "content_type"])
        elif 200 <= response.status_code < 300 and not getattr(response, "streaming", False):
            record.status, record.body = response.status_code, response.content
            record.content_type = response.get("Content-Type", "application/json")
            record.save(update_fields=["status", "body", "content_type"])
        else:
            record.delete()  # refused: nothing was done, the key may be used again
        return response
