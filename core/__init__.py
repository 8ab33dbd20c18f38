"""Framework helpers every app may use, below them all: it imports no app of the project
(an import-linter contract in pyproject.toml). Not a Django app: no models, no templates, no
migrations; modules here read settings and Django's machinery only.

- money.py       integer USD cents as text (the `money` template library wraps it)
- rows.py        INSERT … ON CONFLICT DO NOTHING for model instances (insert_once, insert_many_once)
- admin_base.py  the read-only admin bases (audit trails and chain-reported records)
- cache.py       the fail-open Redis cache backend (settings.CACHES)
- sealing.py     secrets sealed at rest with a key derived from SECRET_KEY
- audit.py       who acts: the team member acting for an account (inventory.audit writes the rows)
- headers.py     the response headers every chain adds (Permissions-Policy, no-store when signed in)
"""
