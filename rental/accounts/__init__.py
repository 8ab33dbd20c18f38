"""The customer's account: sign-up names (usernames.py: look-alikes refused), sign-in limits
(login_limits.py; throttle.py, the fixed-window counter sign-ups, resets and codes share),
two-factor sign-in (two_factor.py: the services; views.py: the /accounts/otp/ pages),
recovery codes and "forgot password" (recovery.py), and the writes from the settings page
(services.py: the account and its settings row, API tokens, saved SSH keys, notice read
marks). A sub-package of rental: its rows (CustomerSettings, ApiToken, SshKey, RecoveryCode)
are rental's tables; it imports only rental.models, rental.validators and rental.shown_once
of rental, so the leases, the pages and the notifications can all use it."""
