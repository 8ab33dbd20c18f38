"""Teams: an account (its holder's user: leases, invoices and the balance stay keyed to it)
with members who act for it in a role. `rights` resolves a request's acting account and
role and declares what each customer page and API route needs; `services` changes
memberships and invitations (each change audited); `views` and `api` are the Team page and
its API routes. Design: docs/adr/0017-teams-and-roles.md."""
