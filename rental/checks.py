"""Deployment checks of rental's own settings (`manage.py check --deploy`, run by
scripts/start.sh migrate before every upgrade)."""
from django.conf import settings
from django.core.checks import Error, Tags, register

# Backends that put the mail where an attacker reading the logs (or nobody) finds it.
LEAKY_EMAIL_BACKENDS = {"django.core.mail.backends.console.EmailBackend",
                        "django.core.mail.backends.locmem.EmailBackend"}


@register(Tags.security, deploy=True)
def email_backend_sends_mail(app_configs, **kwargs):
    if settings.EMAIL_BACKEND in LEAKY_EMAIL_BACKENDS:
        return [Error(f"EMAIL_BACKEND is {settings.EMAIL_BACKEND}: password-reset links would be written to the "
                      "web log (or lost) instead of mailed.",
                      hint="Use the SMTP backend (django.core.mail.backends.smtp.EmailBackend, the production "
                           "default) with EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS.",
                      id="rental.E001")]
    return []
