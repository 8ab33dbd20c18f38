"""The operator's process, above the apps it runs: the lifecycle pass and its lock
(lifecycle/: every sweep of rental, billing, payments and storage, in dependency order),
its Celery tick (tasks.py) and `manage.py lifecycle`, and the back office (backoffice/: the
customer desk, the operations dashboard, the CSV exports and the admin screens that span
inventory, rental and billing, under /admin/ops/).

No models: the rows it keeps (JobRun, JobLock) and the permissions it checks
(billing.view_ops_dashboard) are billing's, as the migrations know them (ADR 0025)."""
