"""Root URLconf: mounts every app's urls (the only module that sees every layer)."""
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from billing import api as billing_api
from billing import views as billing_views
from billing.sla import api as sla_api
from billing.sla import views as sla_views
from fleet.instances import urls as fleet_instance_urls
from rental import api, i18n, team_api, views, webhooks_api, workbench_api, workbench_views
from rental.accounts import login_limits, recovery
from rental.accounts import views as otp_views
from rental.accounts.throttle import per_posted_email, per_user, throttle_posts
from rental.teams import views as team_views
from sizing import urls as sizing_urls
from storage import api as storage_api


class FaviconRedirect(RedirectView):
    """The hashed static URL, looked up per request: at import time production's manifest
    storage may not be readable yet (`check --deploy` runs before collectstatic)."""

    def get_redirect_url(self, *args, **kwargs):
        return static("favicon.svg")

accounts = [
    path("signup/", views.signup, name="signup"),
    path("login/", login_limits.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", throttle_posts("password-check", limit="PASSWORD_CHECKS_PER_USER",
                                     window_minutes="PASSWORD_CHECK_WINDOW_MINUTES", key=per_user)(
        auth_views.PasswordChangeView.as_view()), name="password_change"),
    path("password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    # Account recovery: with a recovery code, or by e-mail where an address is set.
    path("recover/", recovery.forgot_password, name="forgot_password"),
    path("recovery-codes/", recovery.recovery_codes_regenerate, name="recovery_codes"),
    path("recovery-codes/new/", recovery.recovery_codes_show, name="recovery_codes_show"),  # shown once
    # Reset requests are throttled per client address and per address mailed.
    path("password/reset/", throttle_posts("password-reset", limit="PASSWORD_RESETS_PER_IP",
                                           window_minutes="PASSWORD_RESET_WINDOW_MINUTES")(
        throttle_posts("password-reset-email", limit="PASSWORD_RESETS_PER_EMAIL",
                       window_minutes="PASSWORD_RESET_WINDOW_MINUTES", key=per_posted_email)(
            auth_views.PasswordResetView.as_view(email_template_name="registration/password_reset_email.txt"))),
         name="password_reset"),
    path("password/reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("password/reset/<uidb64>/<token>/", auth_views.PasswordResetConfirmView.as_view(),
         name="password_reset_confirm"),
    path("password/reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("otp/setup/", otp_views.otp_setup, name="otp_setup"),
    path("otp/verify/", otp_views.otp_verify, name="otp_verify"),
    path("otp/recovery-codes/", otp_views.otp_recovery_codes, name="otp_recovery_codes"),
    path("otp/disable/", otp_views.otp_disable, name="otp_disable"),
]

customer = [
    path("leases/", views.lease_list, name="lease_list"),
    path("leases/<int:lease_id>/", views.lease_detail, name="lease_detail"),
    path("leases/<int:lease_id>/auto-renew/", views.lease_auto_renew, name="lease_auto_renew"),
    # The workbench: a lease's variables, secrets, ports and start command; the account's
    # registry credentials and variables (rental.workbench).
    path("leases/<int:lease_id>/workbench/", workbench_views.lease_workbench_update, name="lease_workbench"),
    path("account/registry-credentials/", workbench_views.registry_credential_create,
         name="registry_credential_create"),
    path("account/registry-credentials/<int:credential_id>/delete/", workbench_views.registry_credential_remove,
         name="registry_credential_delete"),
    path("account/variables/", workbench_views.account_variable_create, name="account_variable_create"),
    path("account/variables/<int:variable_id>/delete/", workbench_views.account_variable_remove,
         name="account_variable_delete"),
    # Restart / stop / start through the node's desired state (fleet, the node agent).
    path("leases/<int:lease_id>/instance/", include("fleet.instances.urls")),
    path("account/settings/", views.account_settings, name="account_settings"),
    path("account/tokens/", views.token_create, name="token_create"),
    path("account/ssh-keys/", views.ssh_key_create, name="ssh_key_create"),
    path("account/ssh-keys/<int:key_id>/delete/", views.ssh_key_remove, name="ssh_key_delete"),
    path("account/tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("account/webhooks/", include("rental.notifications.urls")),
    path("account/team/", include("rental.teams.urls")),  # teams: members and roles (ADR 0017)
    path("account/switch/", team_views.account_switch, name="account_switch"),
    path("account/notifications/read/", views.notification_read, name="notifications_read_all"),
    path("account/notifications/<int:notification_id>/read/", views.notification_read, name="notification_read"),
    path("order/<slug:offer_slug>/", billing_views.order, name="order"),
    path("billing/sla/", include("billing.sla.urls")),
    path("sla/", sla_views.sla_terms, name="sla_terms"),
    path("billing/", include("billing.urls")),
    path("storage/mine/", include("storage.urls")),
]

api_v1 = [
    path("offers", api.offers, name="api_offers"),
    path("orders", billing_api.orders, name="api_orders"),
    path("leases", api.leases, name="api_leases"),
    path("leases/<int:lease_id>", api.lease_detail, name="api_lease"),
    path("leases/<int:lease_id>/refund", billing_api.refund, name="api_lease_refund"),
    path("leases/<int:lease_id>/sanitization-record", include(fleet_instance_urls.api_urlpatterns)),
    path("invoices/<int:invoice_id>", billing_api.invoice_detail, name="api_invoice"),
    path("schema", api.schema, name="api_schema"),
    # What the command-line client (cli/) needs
    path("account", billing_api.account, name="api_account"),
    path("invoices", billing_api.invoices, name="api_invoices"),
    path("invoices/<int:invoice_id>/quote", billing_api.invoice_quote, name="api_invoice_quote"),
    path("leases/<int:lease_id>/extend", billing_api.lease_extend, name="api_lease_extend"),
    path("leases/<int:lease_id>/auto-renew", api.lease_auto_renew, name="api_lease_auto_renew"),
    path("leases/<int:lease_id>/", include("fleet.api")),  # restart, stop, start
    path("keys", api.ssh_keys, name="api_keys"),
    path("registry-credentials", workbench_api.registry_credentials, name="api_registry_credentials"),
    path("registry-credentials/<int:credential_id>", workbench_api.registry_credential_detail,
         name="api_registry_credential"),
    path("account/variables", workbench_api.account_variables, name="api_account_variables"),
    path("account/variables/<str:name>", workbench_api.account_variable_detail, name="api_account_variable"),
    path("keys/<int:key_id>", api.ssh_key_detail, name="api_key"),
    path("volumes", storage_api.volumes, name="api_volumes"),
    path("volumes/<int:volume_id>", storage_api.volume_delete_api, name="api_volume"),
    path("volumes/<int:volume_id>/attach", storage_api.volume_attach_api, name="api_volume_attach"),
    path("volumes/<int:volume_id>/detach", storage_api.volume_detach_api, name="api_volume_detach"),
    path("volumes/<int:volume_id>/grow", storage_api.volume_grow_api, name="api_volume_grow"),
    path("snapshots", storage_api.snapshots, name="api_snapshots"),
    path("snapshots/<int:snapshot_id>", storage_api.snapshot_delete_api, name="api_snapshot"),
    path("object-storage", storage_api.object_storage, name="api_object_storage"),
    path("object-storage/<int:account_id>/keys", storage_api.s3_key_new_api, name="api_s3_key_new"),
    path("object-storage/keys/<int:key_id>/rotate", storage_api.s3_key_rotate_api, name="api_s3_key_rotate"),
    path("object-storage/keys/<int:key_id>", storage_api.s3_key_revoke_api, name="api_s3_key"),
    path("invoices/<int:invoice_id>/pay", billing_api.invoice_pay, name="api_invoice_pay"),
    path("account/top-up", billing_api.top_up, name="api_top_up"),
    path("quotes/<int:quote_id>/confirm-late", billing_api.quote_confirm_late, name="api_quote_confirm_late"),
    path("sla-claims", sla_api.sla_claims, name="api_sla_claims"),
    path("webhook", webhooks_api.webhook, name="api_webhook"),
    path("webhook/rotate", webhooks_api.webhook_rotate, name="api_webhook_rotate"),
    path("webhook/test", webhooks_api.webhook_test, name="api_webhook_test"),
    path("webhook/deliveries/<int:delivery_id>/redeliver", webhooks_api.webhook_redeliver,
         name="api_webhook_redeliver"),
    path("team", team_api.team, name="api_team"),  # teams (ADR 0017)
    path("team/members/<int:member_id>", team_api.member, name="api_team_member"),
    path("team/invitations/<int:invitation_id>", team_api.invitation, name="api_team_invitation"),
    path("sites", api.sites, name="api_sites"),
    path("images", api.images, name="api_images"),
    path("<path:rest>", api.not_found),
]

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    # Browsers ask for /favicon.ico whatever the page links (it was a 404 on every page).
    path("favicon.ico", FaviconRedirect.as_view(permanent=True)),
    # The calculator's routes themselves, not an include, and before the includes: an include
    # that does not match raises and catches Resolver404, four of them (agent, admin, i18n,
    # accounts) a tenth of a bare view's cost; before api/v1's catch-all 404 (/api/v1/estimate).
    *sizing_urls.urlpatterns,
    path("agent/v1/", include("fleet.urls")),  # the node agents' API (nodeagent/PROTOCOL.md)
    path("admin/", admin.site.urls),
    # Language switcher: Django's set_language (cookie + next), also remembered for notices.
    path("i18n/setlang/", i18n.set_language, name="set_language"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("accounts/", include(accounts)),
    path("api/v1/", include(api_v1)),
    path("pay/", include("billing.payments.urls")),
    path("", include(customer)),
    path("", include("inventory.urls")),
]
handler500 = "storefront.middleware.server_error"  # a database outage is a 503 there too

if settings.BENCH_BASELINE_VIEW:  # bench/load.py's bare-Django baseline
    from rental import bench_views

    urlpatterns.insert(0, path("bench/bare", bench_views.bare))
