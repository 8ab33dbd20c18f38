"""The operators' back office: the customer desk, one page per customer (balance, leases,
invoices, payments, tokens) with the two money actions an operator needs — a balance
adjustment and a refund of a paid invoice to the balance — each with a reason, audited
(services.py, views.py); the admin screens that span inventory, rental and billing
(admin.py: migrations, SLA claims, storage products), the operations dashboard
(dashboard.py) and the CSV exports (exports.py), under /admin/ops/."""
