"""The SLA (SPEC, second document): availability per lease and month from the downtime
records, the credit it earns, and the customer's claims an operator approves or declines
(services.py); the claims page and the public terms (views.py, urls.py)."""
